#!/bin/sh
# tools/gpu_nccl.sh [OUTDIR] [SECONDS] [BINDIR]: pipeline_nccl.h over real NCCL, several ranks on one
# GPU. Binaries and BINDIR/lib/libnccl.so.2 come from `make gpu-nccl NCCL_HOME=... B=gpubuild`
# built elsewhere (defaults: ./gpu-out, 420, and the first of gpubuild and build that holds
# lib/libnccl.so.2). Where no GPU answers it says so and exits 0. What NCCL allows on one GPU:
# several ranks need NCCL >= 2.30.3 with NCCL_MULTI_RANK_GPU_ENABLE=1, a feature NCCL calls
# experimental: "With the default configuration, NCCL should be able to run up to 2 ranks per
# GPU. We also encourage the users to use NCCL_MAX_CTAS to limit the number of channels per rank"
# (NCCL user guide, env.rst, NCCL_MULTI_RANK_GPU_ENABLE, v2.30.7; the variable first appears in
# v2.30.3's src/init.cc, not in 2.29.7, whose init fails "Duplicate GPU detected"). In order:
#   1. where the binaries are (BINDIR/lib/libnccl.so.2, else stop: the toolkit's NCCL 2.28 would
#      refuse every run of two ranks on one GPU) and which NCCL they load (test_nccl_pipeline-gpu
#      nccl-version: below 2.30.3 it stops, saying so);
#   2. conn_probe: do streams beyond CUDA_DEVICE_MAX_CONNECTIONS wait behind each other (default
#      and 32)? The thread tests run with CUDA_DEVICE_MAX_CONNECTIONS=32;
#   3. MUST PASS: test_nccl_pipeline-gpu gpu 2: two ranks on the GPU as threads of one process,
#      NCCL's default configuration: every schedule kind at p = 2, LOCAL and BROADCAST shapes,
#      blocking and non-blocking communicators, bit-exact against the sequential run; a failure
#      drained and the next step bit-exact; shared split resources refused; no pp_nccl_step_end
#      between steps; a missing peer timed out at create. It prints every case's step time: the
#      only step times this script reports (threads of one process; processes sharing a GPU
#      time-slice it, NVIDIA/nccl#32, so their times say little);
#   4. TRIED, reported as they come out (pass / hang at a deadline / refused / failed, with
#      NCCL's warnings), never failing the script: p = 3 and p = 4 as threads (gpu-matrix 3 and
#      4) and the pp 2 x dp 2 grid (4 ranks), under NCCL_MAX_CTAS=$PP_GPU_MAX_CTAS (default 2);
#   5. gpt_nccl (packed variable-length sequences), one process per rank: p = 1, the reference
#      (must pass), then 1F1B p = 2, 3, 4, interleaved p = 2, ZB-V p = 2, GPipe p = 4, the
#      training loop's options and pp 2 x dp 2, each compared byte for byte with p = 1's losses,
#      and --tp 2 at pp 1 and 2, within 1e-5 of them, its checkpoint resumed at tp 1 and at
#      pp 2 x tp 2 (tried: two or more processes on one GPU;
#      NCCL_MAX_CTAS as above beyond two ranks); and
#      gpt_nccl-old (a build from before the connections were set up at create, if BINDIR has it).
# Logs in OUTDIR, the summary last; exit 1 when a must-pass run did not pass.
# Preparing it on a machine without a GPU (about 25 minutes on two cores; docs/gpu.md):
#   git -C NCCL_MIRROR archive v2.30.7-1 | tar -x -C /tmp/nccl-src
#   sh tools/build_nccl.sh /tmp/nccl-src build/nccl 2         (NVIDIA/nccl >= 2.30.3)
#   make gpu-nccl NCCL_HOME=build/nccl B=gpubuild              (it stops on an NCCL below 2.30.3)
#   the old build, optional: git worktree add /tmp/old 7b371f8 && (cd /tmp/old &&
#     nvcc -O2 -std=c++17 -gencode arch=compute_90,code=sm_90 -I. -I/tmp/nccl/include -c examples/gpt_nccl.cu -o g.o &&
#     g++ g.o -o "$OLDPWD/gpubuild/gpt_nccl-old" -L/tmp/nccl/lib -L/usr/local/cuda/lib64 -lnccl -lcudart -lcublas -lpthread)
# then carry gpubuild to the GPU machine and run: sh tools/gpu_nccl.sh OUT 420 gpubuild
out=${1:-gpu-out}
budget=${2:-420}
here=$(dirname "$0")
if [ -n "$3" ]; then bin=$3
else bin=gpubuild; for d in gpubuild build; do [ -f "$d/lib/libnccl.so.2" ] && { bin=$d; break; }; done; fi
if ! nvidia-smi -L >/dev/null 2>&1; then
    echo "gpu_nccl: no GPU here (nvidia-smi), nothing run"
    exit 0
fi
if [ ! -f "$bin/lib/libnccl.so.2" ] || [ ! -x "$bin/test_nccl_pipeline-gpu" ]; then
    echo "gpu_nccl: $bin has no lib/libnccl.so.2 or test_nccl_pipeline-gpu: build them with"
    echo "  make gpu-nccl NCCL_HOME=<an NCCL >= 2.30.3, e.g. from tools/build_nccl.sh> B=$bin"
    echo "and carry $bin here (the toolkit's NCCL 2.28 refuses two ranks on one GPU: Duplicate GPU). Nothing run."
    exit 1
fi
. "$here/gpu_lib.sh"
gpu_libs no-nccl > "$out/env.log"   # NCCL: $bin/lib alone, never the toolkit's
LD_LIBRARY_PATH="$(cd "$bin/lib" && pwd):$LD_LIBRARY_PATH"
export LD_LIBRARY_PATH
export NCCL_MULTI_RANK_GPU_ENABLE=1
ctas=${PP_GPU_MAX_CTAS:-2}
{ date -u; nvidia-smi -L; echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"; ldd "$bin/test_nccl_pipeline-gpu" | grep -E "nccl|cudart"; } >> "$out/env.log" 2>&1
rc=skipped
run "NCCL version" "$out/env.log" 20 "$bin/test_nccl_pipeline-gpu" nccl-version
if [ "$rc" != 0 ]; then
    grep "^nccl-version:" "$out/env.log"
    echo "gpu_nccl: the binaries load an NCCL below 2.30.3 (or none: rc=$rc, see $out/env.log); several ranks on one"
    echo "GPU need 2.30.3 (NCCL_MULTI_RANK_GPU_ENABLE). Nothing more run."
    cat "$sum"
    exit 1
fi
grep "^nccl-version:" "$out/env.log" | tee -a "$sum"
M="--generated --dim 64 --heads 4 --layers 8 --max-len 64 --seqs-per-step 16 -m 8 --lr 0.001"
bad=0
# A run that must pass: its rc decides the script's exit code.
must() { # NAME LOG TIMEOUT CMD...
    rc=skipped
    run "$@"
    [ "$rc" = 0 ] || bad=1
}
# A run beyond what NCCL promises on one GPU: what came out, with NCCL's warnings; never fails the script.
verdict() { # NAME LOG
    said=$(grep -v -e '^===' -e ': rc=' "$2")
    if [ "$rc" = 0 ]; then v=pass
    elif [ "$rc" = skipped ]; then v="skipped (out of time)"
    elif [ "$rc" = 124 ] || [ "$rc" = 137 ]; then v="hang: killed at the script's timeout (rc=$rc)"
    elif echo "$said" | grep -qE "Multiple Ranks are using the same GPU|Duplicate GPU|invalid usage|out of memory|resources"; then v="refused by NCCL (rc=$rc)"
    elif echo "$said" | grep -qiE "timed out|timeout|did not finish|deadline"; then v="hang at a deadline (rc=$rc)"
    else v="failed (rc=$rc)"; fi
    echo "tried: $1: $v" | tee -a "$sum"
    grep -h "NCCL WARN" "$2" | sed 's/.*NCCL WARN */NCCL WARN /' | sort | uniq -c | sort -rn | head -4 | cut -c1-200 |
        sed 's/^ */    (x/; s/ NCCL WARN/) NCCL WARN/' | tee -a "$sum"
}
tried() { # NAME LOGNAME TIMEOUT CMD...
    name=$1; log="$out/$2"; to=$3; shift 3
    : > "$log"
    rc=skipped
    run "$name" "$log" "$to" env NCCL_MAX_CTAS="$ctas" NCCL_DEBUG=WARN "$@"
    verdict "$name" "$log"
}
gpt() { # NAME WORLD TIMEOUT ARGS...: gpt_nccl, one process per rank, its own log; p = 1 must pass, the rest are tried
    name=$1; n=$2; to=$3; shift 3
    log="$out/gpt-$(echo "$name" | tr -c 'A-Za-z0-9=\n' '_').log"
    rm -f "/tmp/pp_nccl_id.$$"
    : > "$log"
    rc=skipped
    c=; [ "$n" -gt 2 ] && c="NCCL_MAX_CTAS=$ctas"
    run "$name" "$log" "$to" env $c NCCL_DEBUG=WARN sh "$here/nccl_local.sh" "$n" "$bin/gpt_nccl-nompi" --id-file "/tmp/pp_nccl_id.$$" "$@"
    if [ "$n" -gt 1 ]; then verdict "$name ($n processes on one GPU)" "$log"; else [ "$rc" = 0 ] || bad=1; fi
}
same() { # WHAT FILE_A FILE_B: byte for byte, reported (tried: never fails the script)
    if cmp -s "$2" "$3"; then echo "  $1: byte for byte p=1's" | tee -a "$sum"
    else echo "  $1: DIFFERS from p=1's (or missing)" | tee -a "$sum"; fi
}
run "conn_probe (default connections)" "$out/conn_probe.log" 30 "$bin/conn_probe" 16
run "conn_probe (32 connections)" "$out/conn_probe.log" 30 env CUDA_DEVICE_MAX_CONNECTIONS=32 "$bin/conn_probe" 16
# 3. what must pass: two ranks, threads of one process, NCCL's defaults
must "MUST PASS: test_nccl_pipeline, 2 ranks as threads of one process" "$out/test_nccl_pipeline.log" 150 \
    env CUDA_DEVICE_MAX_CONNECTIONS=32 NCCL_DEBUG=WARN "$bin/test_nccl_pipeline-gpu" gpu 2
grep -E "second step" "$out/test_nccl_pipeline.log" | sed 's/^nccl-pipeline: /  step time: /' | tee -a "$sum"
# 4. beyond two ranks on one GPU: tried, as they come out
tried "test_nccl_pipeline p=3 as threads, NCCL_MAX_CTAS=$ctas" tried-p3.log 90 env CUDA_DEVICE_MAX_CONNECTIONS=32 "$bin/test_nccl_pipeline-gpu" gpu-matrix 3
grep -E "second step" "$out/tried-p3.log" | sed 's/^nccl-pipeline: /  step time: /' | tee -a "$sum"
tried "test_nccl_pipeline p=4 as threads, NCCL_MAX_CTAS=$ctas" tried-p4.log 90 env CUDA_DEVICE_MAX_CONNECTIONS=32 "$bin/test_nccl_pipeline-gpu" gpu-matrix 4
grep -E "second step" "$out/tried-p4.log" | sed 's/^nccl-pipeline: /  step time: /' | tee -a "$sum"
tried "test_nccl_grid pp 2 x dp 2 (4 threads), NCCL_MAX_CTAS=$ctas" tried-grid.log 60 env CUDA_DEVICE_MAX_CONNECTIONS=32 "$bin/test_nccl_grid-gpu"
# 5. gpt_nccl, one process per rank (no step times: processes on one GPU time-slice it)
if [ -x "$bin/gpt_nccl-old" ]; then
    rm -f "/tmp/pp_nccl_id.$$"
    run "old build, 1f1b p=3 (expected to stall)" "$out/old.log" 45 env NCCL_MAX_CTAS="$ctas" sh "$here/nccl_local.sh" 3 "$bin/gpt_nccl-old" \
        --id-file "/tmp/pp_nccl_id.$$" -p 3 --steps 2 --timeout 20 $M
fi
gpt "p=1 reference" 1 60 -p 1 --steps 50 --timeout 60 --loss-log "$out/loss-p1.txt" $M
for c in "1f1b 2 1" "1f1b 3 1" "1f1b 4 1" "interleaved 2 2" "zb-v 2 2" "gpipe 4 1"; do
    set -- $c
    gpt "$1 p=$2" "$2" 60 -p "$2" -v "$3" --schedule "$1" --steps 50 --timeout 60 --loss-log "$out/loss-$1-p$2.txt" $M
    same "$1 p=$2, 50 steps' losses" "$out/loss-p1.txt" "$out/loss-$1-p$2.txt"
done
TR="--wd 0.1 --clip 1 --warmup 3 --eval-every 4 --eval-seqs 32"
ck=/tmp/pp_gpu_nccl_ckpt.$$
gpt "training p=1" 1 60 -p 1 --steps 12 --timeout 60 $M $TR --save $ck.p1 --loss-log "$out/loss-train-p1.txt"
gpt "training interleaved p=4" 4 60 -p 4 -v 2 --schedule interleaved --steps 12 --timeout 60 $M $TR --save $ck.p4 --loss-log "$out/loss-train-p4.txt"
gpt "training interleaved p=4, 6 steps" 4 60 -p 4 -v 2 --schedule interleaved --steps 6 --timeout 60 $M $TR --save $ck.half
gpt "training 1f1b p=2, resumed for 6" 2 60 -p 2 --steps 12 --timeout 60 $M $TR --resume $ck.half --save $ck.res
same "training p=4 losses" "$out/loss-train-p4.txt" "$out/loss-train-p1.txt"
same "training p=4 checkpoint" $ck.p4 $ck.p1
same "training resumed checkpoint" $ck.res $ck.p1
# pp 2 x dp 2: the data-parallel sum from the gradients-final hooks (the default) against one
# all-reduce after the step (--no-overlap): the same losses and checkpoint, byte for byte
gpt "pp 2 x dp 2, overlapped" 4 60 -p 2 --dp 2 --steps 12 --timeout 60 $M $TR --bucket-kb 64 --save $ck.ov --loss-log "$out/loss-dp2-ov.txt"
gpt "pp 2 x dp 2, --no-overlap" 4 60 -p 2 --dp 2 --steps 12 --timeout 60 $M $TR --no-overlap --save $ck.no --loss-log "$out/loss-dp2-no.txt"
if cmp -s "$out/loss-dp2-ov.txt" "$out/loss-dp2-no.txt" && cmp -s $ck.ov $ck.no; then echo "  pp 2 x dp 2: overlapped = after the step, losses and checkpoint byte for byte" | tee -a "$sum"
else echo "  pp 2 x dp 2: overlapped DIFFERS from --no-overlap (or missing)" | tee -a "$sum"; fi
# tensor parallelism (--tp: NCCL's all-reduces on the layer's stream, the boundaries split over
# the TP group): 12 steps against the first 12 of p = 1's, within 1e-5 (the partial sums add in
# another order, so not bit for bit)
gpt "pp 1 x tp 2" 2 60 -p 1 --tp 2 --steps 12 --timeout 60 $M --loss-log "$out/loss-tp2.txt"
gpt "pp 2 x tp 2" 4 60 -p 2 --tp 2 --steps 12 --timeout 60 $M --loss-log "$out/loss-pp2-tp2.txt"
for f in loss-tp2 loss-pp2-tp2; do
    if [ -s "$out/$f.txt" ] && command -v python3 >/dev/null 2>&1; then
        python3 - "$out/loss-p1.txt" "$out/$f.txt" <<'PY' | tee -a "$sum"
import sys
def losses(p): return [[float.fromhex(x) for x in l.split()[2:]] for l in open(p)]
a, b = losses(sys.argv[1]), losses(sys.argv[2])
worst = max(abs(y - x) / abs(x) for ra, rb in zip(a, b) for x, y in zip(ra, rb))
print("  %s: %d steps, the largest relative difference from p=1's losses %.3g (%s 1e-5)" % (sys.argv[2].split("/")[-1], len(b), worst, "within" if worst <= 1e-5 else "NOT within"))
PY
    else echo "  $f: no losses (or no python3)" | tee -a "$sum"; fi
done
# --tp's checkpoint holds the whole model (the tp = 1 layout): saved at tp 2, it resumes at tp 1 and at pp 2 x tp 2
gpt "pp 1 x tp 2, 6 steps, saved" 2 60 -p 1 --tp 2 --steps 6 --timeout 60 $M --save $ck.tp2
gpt "resumed from the tp 2 file at tp 1" 1 60 -p 1 --steps 12 --timeout 60 $M --resume $ck.tp2
gpt "resumed from the tp 2 file at pp 2 x tp 2" 4 60 -p 2 --tp 2 --steps 12 --timeout 60 $M --resume $ck.tp2
rm -f $ck.*
echo "--- $(( $(date +%s) - t0 )) s"
for f in "$out"/*.log; do echo "##### $f"; grep -E "passed|FAIL|step +(0|1|10|11|49)[ /]|rror|stall|timed out|did not|memory|conn_probe|shares|val loss|saved|resumed|NCCL WARN" "$f" | cut -c1-300 | tail -30; done
cat "$sum"
[ $bad = 0 ] && echo "gpu_nccl: every must-pass run passed (the tried ones are reported above as they came out)" \
             || echo "gpu_nccl: a must-pass run FAILED"
exit $bad
