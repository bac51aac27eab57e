#!/bin/sh
# The GPU checks of the cuBLAS GPT and the peer comparison, in one call:
#   gpt_cuda --vs-naive (cuBLAS against the naive kernels), gpt_cuda --check per schedule on
#   cuBLAS, gpt_cuda --bench, gpt_nccl -p 1, then ours (build/peers_ours_cuda) against
#   torch.distributed.pipelining on the same GPU, alternating, on the small MLP of the anchor
#   (8 x 1024, micro-batches of 8 rows, m = 32) and on run_peers.py's GPU setting.
#   sh tools/gpu_peers.sh [OUTDIR] [SECONDS]     (defaults: ./gpu-out, 400)
# Needs python3 with torch where the torch columns are wanted. Logs in OUTDIR, summary last.
out=${1:-gpu-out}
budget=${2:-400}
. "$(dirname "$0")/gpu_lib.sh"
gpu_libs > "$out/libs.log"

run "gpt_cuda --vs-naive" "$out/gpt.log" 90 build/gpt_cuda -p 4 --steps 10 --vs-naive
run "gpt_cuda --vs-naive C=512 L=8" "$out/gpt.log" 120 build/gpt_cuda -p 4 --steps 6 --dim 512 --heads 8 --layers 8 --vs-naive
for s in gpipe 1f1b interleaved zb-h1 zb-v; do
    run "gpt_cuda --check $s (cuBLAS)" "$out/gpt.log" 40 build/gpt_cuda -p 4 --schedule "$s" --check --steps 5
done
rm -f /tmp/pp_nccl_id
run "gpt_nccl -p 1 (cuBLAS)" "$out/gpt.log" 40 build/gpt_nccl-nompi -p 1 -m 4 --steps 3 --id-file /tmp/pp_nccl_id --timeout 30

A="-p 4 -m 32 --layers 8 --in 1024 --hidden 1024 --classes 1024 --rows 256 --steps 20 --warmup 3"
for rep in ${PEERS_REPS:-1 2}; do
    run "ours anchor rep $rep" "$out/peers.log" 60 build/peers_ours_cuda $A
    for s in gpipe 1f1b interleaved; do
        v=1; [ "$s" = interleaved ] && v=2
        run "torch anchor $s rep $rep" "$out/peers.log" 90 env PYTHONUNBUFFERED=1 python3 bench/peers/torch_pp.py --device cuda \
            --schedule "$s" -v "$v" $A --no-overhead
    done
done
run "gpt_cuda --bench (cuBLAS)" "$out/gpt.log" 45 build/gpt_cuda --bench
run "gpt_cuda --bench C=512 L=8 (cuBLAS)" "$out/gpt.log" 60 build/gpt_cuda --bench --dim 512 --heads 8 --layers 8
run "run_peers.py --gpu" "$out/peers_big.log" 240 python3 bench/peers/run_peers.py --gpu --ours-cuda build/peers_ours_cuda \
    --reps 1 --steps 5 --warmup 2
echo "--- $(( $(date +%s) - t0 )) s"
grep -E "vs-naive:|check: loss|pipelined / unpipelined|unpipelined p=1|1f1b p=4|step   2" "$out/gpt.log"
grep -E "^(gpipe|1f1b|interleaved) |^RESULT" "$out/peers.log" | sed 's/"rss_kb.*//' | cut -c1-400
tail -12 "$out/peers_big.log"
cat "$sum"
