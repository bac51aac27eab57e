#!/bin/sh
# The GPU checks in one call: build (unless build/ already holds sm_90 binaries), test_cuda,
# gpt_cuda --check for every schedule (and interleaved with --dtype bf16), bubble_cuda, gpt_nccl -p 1, gpt_cuda --bench, then the
# compute-sanitizer tools on test_cuda --quick, bubble_cuda --detail, gpt_cuda --bench (and with
# PP_GPU_LONG=1 set, the same at C=512, 8 blocks), while time is left.
#   sh tools/gpu_run.sh [OUTDIR] [SECONDS]      (defaults: ./gpu-out, 400)
# Each section has its own timeout; sections are skipped once SECONDS have passed. Logs go to
# OUTDIR (at most 8 files); the summary is printed last.
out=${1:-gpu-out}
budget=${2:-400}
. "$(dirname "$0")/gpu_lib.sh"

command -v compute-sanitizer >/dev/null || PATH="$PATH:/usr/local/cuda/bin:$(dirname "$(find /usr/local /opt -name compute-sanitizer -type f 2>/dev/null | head -1)")"
{ date -u; nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.total --format=csv;
  nvcc --version | tail -2; uname -r; nproc; } > "$out/env.log" 2>&1
gpu_libs >> "$out/env.log"

if ! build/test_cuda --probe >> "$out/env.log" 2>&1; then
    echo "prebuilt test_cuda did not start: building here" >> "$out/env.log"
    run build "$out/env.log" 120 make -j16 cuda
fi
run gpt_nccl_ldd "$out/env.log" 5 sh -c 'ldd build/gpt_nccl-nompi | grep -E "nccl|cudart"'

run test_cuda "$out/test_cuda.log" 90 build/test_cuda
for s in gpipe 1f1b interleaved zb-h1 zb-v; do
    run "gpt_cuda --check $s" "$out/gpt_check.log" 30 build/gpt_cuda -p 4 --schedule "$s" --check --steps 5
done
run "gpt_cuda --check bf16 interleaved" "$out/gpt_check.log" 30 build/gpt_cuda -p 4 --schedule interleaved --check --steps 5 --dtype bf16
run "gpt_cuda --check --recompute 1" "$out/gpt_check.log" 30 build/gpt_cuda -p 4 --check --steps 5 --recompute 1
for r in 0 1; do run "gpt_cuda -p 4 --recompute $r (step time, peak stash)" "$out/recompute.log" 45 build/gpt_cuda -p 4 --steps 12 --dim 256 --heads 8 --layers 8 --recompute $r; done
run "gpt_cuda training loop on the GPU" "$out/gpt_check.log" 90 env TRAINER_GPU=1 sh tests/test_cuda_trainer.sh build/gpt_cuda
run bubble_cuda "$out/bubble.log" 60 build/bubble_cuda
run "bubble_cuda MAX_CONNECTIONS=32" "$out/bubble.log" 60 env CUDA_DEVICE_MAX_CONNECTIONS=32 build/bubble_cuda --quick
rm -f /tmp/pp_nccl_id
run "gpt_nccl -p 1 id-file" "$out/nccl.log" 40 build/gpt_nccl-nompi -p 1 -m 4 --steps 3 --id-file /tmp/pp_nccl_id --timeout 30
run "gpt_nccl -p 1" "$out/nccl.log" 30 env NCCL_DEBUG=WARN build/gpt_nccl-nompi -p 1 -m 4 --steps 3
# the training loop's options (AdamW, --clip, warm-up, held-out evaluation, checkpoints): 8 steps
# whole, 4 then 4 resumed, and gpt_cuda's 8 at p = 2 (the same model, batches and update: the
# same file expected); tools/gpu_nccl.sh does it across ranks
TR="-m 4 --wd 0.1 --clip 1 --warmup 2 --eval-every 4 --eval-seqs 64"
ck=/tmp/pp_gpu_run_ckpt.$$
run "gpt_nccl -p 1 training, 8 steps" "$out/nccl.log" 40 build/gpt_nccl-nompi -p 1 $TR --steps 8 --save $ck.full
run "gpt_nccl -p 1 training, 4 steps" "$out/nccl.log" 40 build/gpt_nccl-nompi -p 1 $TR --steps 4 --save $ck.half
run "gpt_nccl -p 1 training, resumed for 4" "$out/nccl.log" 40 build/gpt_nccl-nompi -p 1 $TR --steps 8 --resume $ck.half --save $ck.res
run "gpt_cuda -p 2 training, 8 steps" "$out/nccl.log" 40 build/gpt_cuda -p 2 $TR --steps 8 --save $ck.cuda
if cmp -s $ck.full $ck.res; then echo "gpt_nccl resumed = uninterrupted, byte for byte" | tee -a "$sum"
else echo "gpt_nccl resumed: checkpoint DIFFERS from the uninterrupted run's (or missing)" | tee -a "$sum"; fi
if cmp -s $ck.full $ck.cuda; then echo "gpt_nccl -p 1 and gpt_cuda -p 2 saved the same bytes" | tee -a "$sum"
else echo "gpt_nccl -p 1 and gpt_cuda -p 2: checkpoints differ (or missing)" | tee -a "$sum"; fi
rm -f $ck.*
[ "$rc" = 0 ] || run "gpt_nccl -p 1 under cuda-gdb" "$out/nccl.log" 60 cuda-gdb -batch -ex run -ex bt --args build/gpt_nccl-nompi -p 1 -m 4 --steps 3
for tool in memcheck synccheck racecheck initcheck; do
    run "sanitizer $tool" "$out/test_cuda.log" 60 compute-sanitizer --tool $tool --error-exitcode 1 build/test_cuda --quick
done
run "bubble_cuda --detail 1f1b 4 32" "$out/detail.log" 30 build/bubble_cuda --detail 1f1b 4 32
run "gpt_cuda --bench" "$out/bench.log" 45 build/gpt_cuda --bench
[ -n "$PP_GPU_LONG" ] && run "gpt_cuda --bench C=512 L=8" "$out/bench.log" 60 build/gpt_cuda --bench --dim 512 --heads 8 --layers 8
echo "--- $(( $(date +%s) - t0 )) s"
for f in "$out"/*.log; do echo "##### $f"; grep -E "passed|failed|FAIL|rror|ratio|OK|step|bench|ERROR|====|bubble|copies|MiB|loss|saved|resumed" "$f" | tail -25; done
cat "$sum"
