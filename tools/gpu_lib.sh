# tools/gpu_lib.sh - sourced by tools/gpu_run.sh and tools/gpu_peers.sh: the output folder, the
# time budget and `run NAME LOG TIMEOUT CMD...`, which runs CMD with its own timeout (cut to what
# is left of the budget), appends its output to LOG and records its exit code and seconds in
# OUTDIR/summary.txt. Set out and budget before sourcing.
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
