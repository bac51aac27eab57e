#!/bin/sh
# tools/gpu_nccl.sh [OUTDIR] [SECONDS] [BINDIR]: pipeline_nccl.h over real NCCL, several ranks on one
# GPU (NCCL >= 2.30, NCCL_MULTI_RANK_GPU_ENABLE=1), each rank a process (tools/nccl_local.sh, the
# NCCL id through a file). Binaries and BINDIR/lib/libnccl.so.2 from `make gpu-nccl` built elsewhere
# (defaults: ./gpu-out, 330, build). Where no GPU answers it says so and exits 0. In order:
#   0. conn_probe: do streams beyond CUDA_DEVICE_MAX_CONNECTIONS wait behind each other (default
#      and 32)? The ranks below are threads of one process on one GPU: their streams add up, so
#      the thread tests run with CUDA_DEVICE_MAX_CONNECTIONS=32;
#   1. test_nccl_pipeline-gpu gpu: ranks as threads of one process, every schedule kind at p = 2, 3,
#      4 (and 1F1B at p = 8), dense, LOCAL and BROADCAST shapes, blocking and non-blocking
#      communicators, bit-exact against the sequential run; a failure drained and the next step
#      bit-exact; shared split resources refused; no pp_nccl_step_end between steps;
#      test_nccl_grid-gpu: pp 2 x dp 2 with tied layers;
#   2. gpt_nccl-old (a build from before the connections were set up at create, if BINDIR has it)
#      at p = 3: NCCL's lazy set-up stalls its first step (the deadline: --timeout 20);
#   3. gpt_nccl (packed variable-length sequences) p = 1, the reference, then 1F1B p = 2, 3, 4,
#      interleaved p = 2, ZB-V p = 2, GPipe p = 4, each 50 steps writing every micro-batch's loss
#      in hex (--loss-log): every log must be byte for byte p = 1's (the pipelined gradients equal
#      the sequential ones, so the training does, step after step);
#   4. the training loop's options (--wd, --clip, --warmup, --eval-every, --save, --resume): 12
#      steps at p = 1 and at interleaved p = 4 (losses and checkpoints byte for byte p = 1's), 6
#      at p = 4 saved and resumed at 1F1B p = 2 for the other 6 (the checkpoint p = 1's);
#   5. step time of gpt_nccl -p 4 against gpt_cuda -p 4 (one process, four streams) on the same GPU.
# Logs in OUTDIR, the summary last; exit 1 when a run that must pass did not, or a log differs.
# Preparing it on a machine without a GPU (about 10 minutes on two cores):
#   sh tools/build_nccl.sh NCCL_CHECKOUT /tmp/nccl            (NVIDIA/nccl >= 2.30)
#   make gpu-nccl NCCL_HOME=/tmp/nccl B=gpubuild              (11 MB with the library)
#   the old build, optional: git worktree add /tmp/old 7b371f8 && (cd /tmp/old &&
#     nvcc -O2 -std=c++17 -gencode arch=compute_90,code=sm_90 -I. -I/tmp/nccl/include -c examples/gpt_nccl.cu -o g.o &&
#     g++ g.o -o "$OLDPWD/gpubuild/gpt_nccl-old" -L/tmp/nccl/lib -L/usr/local/cuda/lib64 -lnccl -lcudart -lcublas -lpthread)
# then carry gpubuild to the GPU machine and run: sh tools/gpu_nccl.sh OUT 330 gpubuild
out=${1:-gpu-out}
budget=${2:-330}
bin=${3:-build}
here=$(dirname "$0")
if ! nvidia-smi -L >/dev/null 2>&1; then
    echo "gpu_nccl: no GPU here (nvidia-smi), nothing run"
    exit 0
fi
. "$here/gpu_lib.sh"
gpu_libs > "$out/env.log"
[ -f "$bin/lib/libnccl.so.2" ] && LD_LIBRARY_PATH="$(cd "$bin/lib" && pwd):$LD_LIBRARY_PATH" && export LD_LIBRARY_PATH
export NCCL_MULTI_RANK_GPU_ENABLE=1
{ date -u; nvidia-smi -L; echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"; ldd "$bin/gpt_nccl-nompi" | grep -E "nccl|cudart"; } >> "$out/env.log" 2>&1
M="--generated --dim 64 --heads 4 --layers 8 --max-len 64 --seqs-per-step 16 -m 8 --lr 0.001"
bad=0
gpt() { # NAME WORLD TIMEOUT ARGS...
    name=$1; n=$2; to=$3; shift 3
    rm -f "/tmp/pp_nccl_id.$$"
    run "$name" "$out/gpt_nccl.log" "$to" sh "$here/nccl_local.sh" "$n" "$bin/gpt_nccl-nompi" --id-file "/tmp/pp_nccl_id.$$" "$@"
}
run "conn_probe (default connections)" "$out/conn_probe.log" 30 "$bin/conn_probe" 16
run "conn_probe (32 connections)" "$out/conn_probe.log" 30 env CUDA_DEVICE_MAX_CONNECTIONS=32 "$bin/conn_probe" 16
run "test_nccl_pipeline (real NCCL, threads)" "$out/test_nccl_pipeline.log" 150 env CUDA_DEVICE_MAX_CONNECTIONS=32 "$bin/test_nccl_pipeline-gpu" gpu
run "test_nccl_grid (real NCCL, threads)" "$out/test_nccl_grid.log" 60 env CUDA_DEVICE_MAX_CONNECTIONS=32 "$bin/test_nccl_grid-gpu"
if [ -x "$bin/gpt_nccl-old" ]; then
    rm -f "/tmp/pp_nccl_id.$$"
    run "old build, 1f1b p=3 (expected to stall)" "$out/old.log" 45 sh "$here/nccl_local.sh" 3 "$bin/gpt_nccl-old" \
        --id-file "/tmp/pp_nccl_id.$$" -p 3 --steps 2 --timeout 20 $M
fi
gpt "p=1 reference" 1 60 -p 1 --steps 50 --timeout 60 --loss-log "$out/loss-p1.txt" $M
for c in "1f1b 2 1" "1f1b 3 1" "1f1b 4 1" "interleaved 2 2" "zb-v 2 2" "gpipe 4 1"; do
    set -- $c
    gpt "$1 p=$2" "$2" 60 -p "$2" -v "$3" --schedule "$1" --steps 50 --timeout 60 --loss-log "$out/loss-$1-p$2.txt" $M
    if cmp -s "$out/loss-p1.txt" "$out/loss-$1-p$2.txt"; then echo "$1 p=$2: 50 steps, every loss bit-identical to p=1" | tee -a "$sum"
    else echo "$1 p=$2: losses DIFFER from p=1 (or missing)" | tee -a "$sum"; bad=1; fi
done
TR="--wd 0.1 --clip 1 --warmup 3 --eval-every 4 --eval-seqs 32"
ck=/tmp/pp_gpu_nccl_ckpt.$$
gpt "training p=1" 1 60 -p 1 --steps 12 --timeout 60 $M $TR --save $ck.p1 --loss-log "$out/loss-train-p1.txt"
gpt "training interleaved p=4" 4 60 -p 4 -v 2 --schedule interleaved --steps 12 --timeout 60 $M $TR --save $ck.p4 --loss-log "$out/loss-train-p4.txt"
gpt "training interleaved p=4, 6 steps" 4 60 -p 4 -v 2 --schedule interleaved --steps 6 --timeout 60 $M $TR --save $ck.half
gpt "training 1f1b p=2, resumed for 6" 2 60 -p 2 --steps 12 --timeout 60 $M $TR --resume $ck.half --save $ck.res
for c in "p4 losses:loss-train-p4.txt:loss-train-p1.txt" "p4 checkpoint:$ck.p4:$ck.p1" "resumed checkpoint:$ck.res:$ck.p1"; do
    what=${c%%:*}; pair=${c#*:}; a=${pair%%:*}; b=${pair#*:}
    case $a in /*) ;; *) a="$out/$a"; b="$out/$b";; esac
    if cmp -s "$a" "$b"; then echo "training, $what: byte for byte p=1's" | tee -a "$sum"
    else echo "training, $what: DIFFERS from p=1's (or missing)" | tee -a "$sum"; bad=1; fi
done
# pp 2 x dp 2: the data-parallel sum from the gradients-final hooks (the default) against one
# all-reduce after the step (--no-overlap): the same losses and checkpoint, byte for byte
gpt "pp 2 x dp 2, overlapped" 4 60 -p 2 --dp 2 --steps 12 --timeout 60 $M $TR --bucket-kb 64 --save $ck.ov --loss-log "$out/loss-dp2-ov.txt"
gpt "pp 2 x dp 2, --no-overlap" 4 60 -p 2 --dp 2 --steps 12 --timeout 60 $M $TR --no-overlap --save $ck.no --loss-log "$out/loss-dp2-no.txt"
if cmp -s "$out/loss-dp2-ov.txt" "$out/loss-dp2-no.txt" && cmp -s $ck.ov $ck.no; then echo "pp 2 x dp 2: overlapped = after the step, losses and checkpoint byte for byte" | tee -a "$sum"
else echo "pp 2 x dp 2: overlapped DIFFERS from --no-overlap (or missing)" | tee -a "$sum"; bad=1; fi
rm -f $ck.*
T="--generated --dim 256 --heads 8 --layers 8 --max-len 128 --seqs-per-step 64 -m 16 --steps 12"
gpt "timing gpt_nccl 1f1b p=4" 4 60 -p 4 --timeout 60 $T
run "timing gpt_cuda 1f1b p=4" "$out/gpt_cuda.log" 60 "$bin/gpt_cuda" -p 4 $T
echo "--- $(( $(date +%s) - t0 )) s"
for f in "$out"/*.log; do echo "##### $f"; grep -E "passed|FAIL|step +(0|1|10|11|49)[ /]|rror|stall|timed out|did not|memory|conn_probe|shares|val loss|saved|resumed" "$f" | cut -c1-300 | tail -30; done
cat "$sum"
grep -q "rc=[^0]" "$sum" && grep "rc=[^0]" "$sum" | grep -qv "expected to stall" && bad=1
exit $bad
