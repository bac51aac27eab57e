#!/bin/sh
# What changed since the last GPU run, rerun in one call, most wanted first:
#   test_cuda (step agreement, bounded pool, the pool's four-step warm-up), gpt_cuda --check for
#   every schedule kind (the interleaved retiring-block stall first, then the kinds added since;
#   a backward's workspace is now zeroed after its received bytes only),
#   bubble_cuda (pp_cuda's sends done only once pulled, early copies into spares: p=8 m=32 is
#   where early copies cost 1.21x once), the peer MLP of the anchor (ours, then torch's
#   interleaved, 1F1B and GPipe on the same GPU), gpt_nccl -p 1 (one channel, sends done by the
#   device's order or a later message of their peer, groups of sends without completion
#   events, receives into released blocks without a stream wait: one rank sends nothing, so
#   only two GPUs exercise these), memcheck on test_cuda --quick, the other sanitizers, while time is left.
#   sh tools/gpu_rerun.sh [OUTDIR] [SECONDS] [BINDIR]     (defaults: ./gpu-out, 400, build)
# Binaries come from `make cuda` (and build/gpt_nccl-nompi) built elsewhere for sm_90, or are
# built here when they do not start. Logs in OUTDIR, summary last.
out=${1:-gpu-out}
budget=${2:-400}
bin=${3:-build}
. "$(dirname "$0")/gpu_lib.sh"

command -v compute-sanitizer >/dev/null || PATH="$PATH:/usr/local/cuda/bin"
{ date -u; nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,clocks.sm,memory.total --format=csv;
  nvcc --version | tail -1; nproc; } > "$out/env.log" 2>&1
gpu_libs >> "$out/env.log"
if ! "$bin/test_cuda" --probe >> "$out/env.log" 2>&1; then
    echo "prebuilt binaries did not start: building here" >> "$out/env.log"
    run build "$out/env.log" 150 make -j16 B="$bin" cuda "$bin/gpt_nccl-nompi"
fi

run test_cuda "$out/test_cuda.log" 90 "$bin/test_cuda"
for s in interleaved gpipe 1f1b zb-h1 zb-v zb-h2 v-half v-min interleaved-mem dualpipev; do
    run "gpt_cuda --check $s" "$out/gpt.log" 30 "$bin/gpt_cuda" -p 4 --schedule "$s" --check --steps 5
done
run bubble_cuda "$out/bubble.log" 60 "$bin/bubble_cuda"
A="-p 4 -m 32 --layers 8 --in 1024 --hidden 1024 --classes 1024 --rows 256 --steps 20 --warmup 3"
run "ours anchor" "$out/peers.log" 60 "$bin/peers_ours_cuda" $A
for s in interleaved 1f1b gpipe; do
    v=1; [ "$s" = interleaved ] && v=2
    run "torch anchor $s" "$out/peers.log" 90 env PYTHONUNBUFFERED=1 python3 bench/peers/torch_pp.py --device cuda \
        --schedule "$s" -v "$v" $A --no-overhead
done
rm -f /tmp/pp_nccl_id
run "gpt_nccl -p 1 id-file" "$out/gpt.log" 40 "$bin/gpt_nccl-nompi" -p 1 -m 4 --steps 3 --id-file /tmp/pp_nccl_id --timeout 30
run "sanitizer memcheck" "$out/sanitize.log" 60 compute-sanitizer --tool memcheck --error-exitcode 1 "$bin/test_cuda" --quick
run "ours anchor rep 2" "$out/peers.log" 60 "$bin/peers_ours_cuda" $A
run "torch anchor interleaved rep 2" "$out/peers.log" 90 env PYTHONUNBUFFERED=1 python3 bench/peers/torch_pp.py --device cuda \
    --schedule interleaved -v 2 $A --no-overhead
for tool in synccheck racecheck initcheck; do
    run "sanitizer $tool" "$out/sanitize.log" 60 compute-sanitizer --tool $tool --error-exitcode 1 "$bin/test_cuda" --quick
done
echo "--- $(( $(date +%s) - t0 )) s"
for f in "$out"/*.log; do echo "##### $f"; grep -E "passed|FAIL|rror|check: loss|RESULT|ratio|^(gpipe|1f1b|interleaved|zb)|ERROR SUMMARY" "$f" | sed 's/"rss_kb.*//' | cut -c1-330 | tail -22; done
cat "$sum"
