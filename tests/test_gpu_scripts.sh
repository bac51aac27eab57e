#!/bin/sh
# tests/test_gpu_scripts.sh [GPU_NCCL_SH]: tools/gpu_nccl.sh (or the script given) and make
# gpu-nccl-check on a machine without a GPU, against stand-ins: an nvidia-smi that answers, and
# binaries that print what real ones would (nothing of CUDA or NCCL runs). Checked:
#   1. with no BINDIR it takes gpubuild/ (where `make gpu-nccl B=gpubuild` puts everything), not
#      build/ (which has no lib/libnccl.so.2: the toolkit's NCCL 2.28 refused every two-rank run);
#   2. a BINDIR without lib/libnccl.so.2: it stops at once, saying how to build one, running nothing;
#   3. binaries that load NCCL 2.28.9 (nccl-version exits 2): it stops, saying 2.30.3 is needed,
#      before any test;
#   4. the matrix: `gpu 2` must pass (threads, NCCL_MULTI_RANK_GPU_ENABLE=1, no NCCL_MAX_CTAS);
#      p = 3 refused by NCCL and p = 4 timed out are reported as such, under NCCL_MAX_CTAS=2,
#      and do not fail the script; a failing `gpu 2` does;
#   5. make gpu-nccl-check: NCCL 2.28.9 refused with a message, 2.30.3 accepted, 2.28.9 accepted
#      with GPU_NCCL_SINGLE_RANK=1.
# Negative control (build/gpu-scripts-control): the same checks against the script as it was
# before (git show cc8d5cc:tools/gpu_nccl.sh), which must fail them.
script=${1:-tools/gpu_nccl.sh}
here=$(pwd)
script=$(cd "$(dirname "$script")" && pwd)/$(basename "$script")
T=$(mktemp -d /tmp/pp_gpu_scripts.XXXXXX)
if [ -n "$PP_KEEP" ]; then echo "gpu-scripts: kept $T"; else trap 'rm -rf "$T"' EXIT; fi
pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL gpu-scripts: $*"; }
mkdir -p "$T/path" "$T/tools"
printf '#!/bin/sh\necho "GPU 0: stand-in (UUID: none)"\n' > "$T/path/nvidia-smi"
chmod +x "$T/path/nvidia-smi"
cp "$script" "$T/tools/gpu_nccl.sh"
cp tools/gpu_lib.sh tools/nccl_local.sh "$T/tools/"
# bins DIR VERSION GPU2_RC: stand-in binaries; each call appends "NAME ARGS | env" to DIR/calls
bins() {
    d=$1
    mkdir -p "$d/lib"
    : > "$d/lib/libnccl.so.2"
    for b in conn_probe test_nccl_grid-gpu gpt_nccl-nompi; do
        cat > "$d/$b" <<EOF
#!/bin/sh
echo "$b \$* | MAX_CTAS=\${NCCL_MAX_CTAS:-} MULTI=\${NCCL_MULTI_RANK_GPU_ENABLE:-}" >> "$d/calls"
while [ \$# -gt 0 ]; do [ "\$1" = --loss-log ] && echo 1.0 > "\$2"; [ "\$1" = --save ] && echo ck > "\$2"; shift; done
exit 0
EOF
    done
    cat > "$d/test_nccl_pipeline-gpu" <<EOF
#!/bin/sh
echo "test_nccl_pipeline-gpu \$* | MAX_CTAS=\${NCCL_MAX_CTAS:-} MULTI=\${NCCL_MULTI_RANK_GPU_ENABLE:-} CONN=\${CUDA_DEVICE_MAX_CONNECTIONS:-}" >> "$d/calls"
case "\$1 \$2" in
"nccl-version "*) echo "nccl-version: the loaded NCCL is $2"; [ $2 -ge 23003 ] && exit 0; exit 2;;
"gpu 2") echo "nccl-pipeline: 1f1b p=2 v=1 m=5 LOCAL blocking: second step 3.00 ms (slowest rank; ranks are threads of one process)"
         echo "nccl-pipeline: 9 passed, $3 failed"; exit $3;;
"gpu-matrix 3") echo "host:1:2 [0] NCCL WARN Multiple Ranks are using the same GPU/Partition."; echo "nccl-pipeline: 0 passed, 1 failed"; exit 1;;
"gpu-matrix 4") echo "FAIL rank 2: wait timed out: rank 2 waited 5 s for rank 1"; exit 1;;
esac
exit 0
EOF
    chmod +x "$d"/conn_probe "$d"/test_nccl_grid-gpu "$d"/gpt_nccl-nompi "$d"/test_nccl_pipeline-gpu
}
g() { (cd "$T" && PATH="$T/path:$PATH" sh tools/gpu_nccl.sh "$@"); }

# 1. no BINDIR: gpubuild
bins "$T/gpubuild" 23007 0
mkdir -p "$T/build"
g "$T/o1" 60 > "$T/o1.txt" 2>&1
rc=$?
grep -q "gpu 2" "$T/gpubuild/calls" 2>/dev/null && ok || bad "with no BINDIR the script did not run gpubuild's binaries (rc=$rc): $(tail -3 "$T/o1.txt")"
[ $rc = 0 ] && ok || bad "with gpubuild's passing stand-ins the script exited $rc"
# 2. a BINDIR without the library
mkdir -p "$T/nolib"
g "$T/o2" 60 "$T/nolib" > "$T/o2.txt" 2>&1
rc=$?
[ $rc != 0 ] && grep -q "lib/libnccl.so.2" "$T/o2.txt" && grep -q "make gpu-nccl" "$T/o2.txt" && ok ||
    bad "a BINDIR without lib/libnccl.so.2: rc=$rc, want non-zero and a message naming make gpu-nccl: $(tail -2 "$T/o2.txt")"
[ ! -f "$T/o2/test_nccl_pipeline.log" ] && ok || bad "a BINDIR without lib/libnccl.so.2: tests were run anyway"
# 3. an NCCL below 2.30.3 loaded
bins "$T/old" 22809 0
g "$T/o3" 60 "$T/old" > "$T/o3.txt" 2>&1
rc=$?
[ $rc != 0 ] && grep -q "2.30.3" "$T/o3.txt" && ok || bad "NCCL 2.28.9 loaded: rc=$rc, want non-zero and a message naming 2.30.3: $(tail -2 "$T/o3.txt")"
grep -q "gpu 2" "$T/old/calls" 2>/dev/null && bad "NCCL 2.28.9 loaded: the tests ran anyway" || ok
# 4. the matrix
s=$T/o1/summary.txt
grep "gpu 2 " "$T/gpubuild/calls" 2>/dev/null | grep -q "MAX_CTAS= MULTI=1 CONN=32" && ok || bad "gpu 2: not with NCCL_MULTI_RANK_GPU_ENABLE=1, CUDA_DEVICE_MAX_CONNECTIONS=32 and NCCL's defaults: $(grep 'gpu 2' "$T/gpubuild/calls")"
grep "gpu-matrix 3" "$T/gpubuild/calls" 2>/dev/null | grep -q "MAX_CTAS=2 MULTI=1" && ok || bad "p = 3 not tried under NCCL_MAX_CTAS=2"
grep "gpu-matrix 4" "$T/gpubuild/calls" 2>/dev/null | grep -q "MAX_CTAS=2 MULTI=1" && ok || bad "p = 4 not tried under NCCL_MAX_CTAS=2"
grep -q "tried: test_nccl_pipeline p=3.*refused by NCCL" "$s" && grep -q "NCCL WARN Multiple Ranks" "$s" && ok ||
    bad "p = 3 refused by NCCL not reported as refused, with NCCL's warning: $(grep 'p=3' "$s")"
grep -q "tried: test_nccl_pipeline p=4.*hang at a deadline" "$s" && ok || bad "p = 4 timed out not reported as a hang at a deadline: $(grep 'p=4' "$s")"
grep -q "step time: .*threads of one process" "$s" && ok || bad "no step time from the threads' run in the summary"
grep -qi "timing gpt_nccl" "$s" && bad "a step time from processes sharing the GPU was reported" || ok
bins "$T/fails" 23007 1
g "$T/o4" 60 "$T/fails" > "$T/o4.txt" 2>&1
rc=$?
[ $rc != 0 ] && ok || bad "a failing gpu 2 (the must-pass run) left the script's exit code 0"
# 5. make gpu-nccl-check
for v in "28 9" "30 3"; do
    set -- $v
    mkdir -p "$T/nccl-2.$1.$2/include"
    printf '#define NCCL_MAJOR 2\n#define NCCL_MINOR %s\n#define NCCL_PATCH %s\n' "$1" "$2" > "$T/nccl-2.$1.$2/include/nccl.h"
done
make --no-print-directory -C "$here" gpu-nccl-check NCCL_HOME="$T/nccl-2.28.9" > "$T/m1.txt" 2>&1 && bad "make gpu-nccl-check accepted NCCL 2.28.9" ||
    { grep -q "2.30.3" "$T/m1.txt" && ok || bad "make gpu-nccl-check refused 2.28.9 without naming 2.30.3: $(cat "$T/m1.txt")"; }
make --no-print-directory -C "$here" gpu-nccl-check NCCL_HOME="$T/nccl-2.30.3" > "$T/m2.txt" 2>&1 && ok || bad "make gpu-nccl-check refused NCCL 2.30.3: $(cat "$T/m2.txt")"
make --no-print-directory -C "$here" gpu-nccl-check NCCL_HOME="$T/nccl-2.28.9" GPU_NCCL_SINGLE_RANK=1 > "$T/m3.txt" 2>&1 && ok ||
    bad "make gpu-nccl-check GPU_NCCL_SINGLE_RANK=1 refused 2.28.9: $(cat "$T/m3.txt")"
echo "gpu-scripts: $pass passed, $fail failed"
[ $fail = 0 ]
