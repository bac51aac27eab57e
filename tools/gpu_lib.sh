# tools/gpu_lib.sh - sourced by tools/gpu_run.sh and tools/gpu_peers.sh: the output folder, the
# time budget and `run NAME LOG TIMEOUT CMD...`, which runs CMD with its own timeout (cut to what
# is left of the budget), appends its output to LOG and records its exit code and seconds in
# OUTDIR/summary.txt; and gpu_libs, which puts NCCL and the CUDA runtime on LD_LIBRARY_PATH and
# says where it found them. Set out and budget before sourcing.
mkdir -p "$out"
t0=$(date +%s)
sum="$out/summary.txt"
: > "$sum"
left() { echo $((budget - ($(date +%s) - t0))); }
run() {
    name=$1; log=$2; to=$3; shift 3
    if [ "$(left)" -lt 5 ]; then echo "$name: skipped (out of time)" | tee -a "$sum"; return; fi
    [ "$to" -gt "$(left)" ] && to=$(left)
    s=$(date +%s)
    echo "=== $name: $*" >> "$log"
    timeout -k 5 "$to" "$@" >> "$log" 2>&1
    rc=$?
    echo "$name: rc=$rc ($(( $(date +%s) - s )) s)" | tee -a "$sum" >> "$log"
}
# NCCL: the toolkit's, else the one the Python packages carry; the CUDA 13 runtime. `gpu_libs
# no-nccl` (tools/gpu_nccl.sh, which carries its own NCCL): the runtime alone, no NCCL searched for.
gpu_libs() {
    nccl=
    [ "$1" = no-nccl ] ||
        nccl=$(ls /usr/local/cuda/lib64/libnccl.so.2 2>/dev/null || find / -name 'libnccl.so.2' -not -path '/proc/*' 2>/dev/null | head -1)
    [ -n "$nccl" ] && LD_LIBRARY_PATH="$(dirname "$nccl"):${LD_LIBRARY_PATH}"
    cudart=$(find /usr/local/cuda*/ /opt -name 'libcudart.so.13' 2>/dev/null | head -1)
    [ -n "$cudart" ] && LD_LIBRARY_PATH="$(dirname "$cudart"):${LD_LIBRARY_PATH}"
    export LD_LIBRARY_PATH
    [ "$1" = no-nccl ] && nccl="not searched (the caller's own)"
    echo "libnccl: ${nccl:-not found}; libcudart: ${cudart:-not found}"
}
