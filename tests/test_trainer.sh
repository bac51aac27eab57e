#!/bin/sh
# tests/test_trainer.sh GPT_CPU [GPT_MPI MPIRUN...] - the loop around the step in the GPT
# trainers (examples/gpt_train.h): the held-out split evaluated with forward-only steps
# (--eval-every) prints "val loss", equals pp_sequential_eval bit for bit (--check) and the same
# at every p and schedule; an evaluation changes nothing of the training (the checkpoint after
# a run with evaluations is the one without, byte for byte); AdamW's decay and the warm-up's
# rates show; bad values are refused. With GPT_MPI and an mpirun command, the same evaluation
# over two MPI ranks, against gpt_cpu's lines. Prints "NAME: N passed, N failed".
kind=trainer
. "${0%/*}/gpt_script.sh"
vals() { grep '^val loss' "$1" | sed 's/  (.*//'; } # the val loss lines without their timing
o="--generated --layers 6 --dim 16 --heads 2 --max-len 24 --seqs-per-step 12 -m 4 --steps 5"
t="--warmup 2 --lr-min 1e-4 --wd 0.1 --clip 1 --eval-seqs 48"
"$cpu" $o $t --schedule interleaved -p 4 -v 2 --eval-every 2 --check --save "$tmp.eval" > "$tmp.p4" 2>&1
check "interleaved p = 4 with --eval-every 2 --check: exit 0" "[ \$? -eq 0 ]" || cat "$tmp.p4"
check "val loss after steps 2, 4 and the last (5)" \
    "[ \$(grep -c '^val loss' '$tmp.p4') -eq 3 ] && grep -q '^val loss [0-9.]* after 4 steps' '$tmp.p4' && grep -q '^val loss [0-9.]* after 5 steps' '$tmp.p4'"
check "the first evaluation = pp_sequential_eval, bit for bit" \
    "grep -q 'check: val loss after 2 steps .* bit-identical (0 of 4 batches differ)' '$tmp.p4'"
check "the training step's check still passes" "grep -q 'check: step 0 loss .* bit-identical; gradients: 0 layers differ' '$tmp.p4'"
check "the warm-up's first rate is lr / 2" "grep -q '^step   0/5  loss [0-9.]*  lr 1.50e-03' '$tmp.p4'"
if [ -z "$mpi" ]; then
    "$cpu" $o $t --schedule interleaved -p 4 -v 2 --save "$tmp.noeval" > "$tmp.out" 2>&1
    check "without --eval-every: exit 0, no val loss" "[ \$? -eq 0 ] && ! grep -q 'val loss' '$tmp.out'"
    check "evaluations change nothing: the checkpoints are equal, byte for byte" "cmp -s '$tmp.eval' '$tmp.noeval'"
    "$cpu" $o $t --schedule 1f1b -p 2 --eval-every 2 --check > "$tmp.p2" 2>&1
    check "1F1B p = 2: the same val losses, the sequential's bits" "[ \$? -eq 0 ] && grep -q 'check: val loss .* bit-identical' '$tmp.p2' && [ \"\$(vals '$tmp.p2')\" = \"\$(vals '$tmp.p4')\" ]"
    "$cpu" $o $t --schedule zb-h1 -p 1 --eval-every 2 --check > "$tmp.p1" 2>&1
    check "ZB-H1 p = 1: the same val losses, the sequential's bits" "[ \$? -eq 0 ] && grep -q 'check: val loss .* bit-identical' '$tmp.p1' && [ \"\$(vals '$tmp.p1')\" = \"\$(vals '$tmp.p4')\" ]"
    "$cpu" $o --warmup 2 --lr-min 1e-4 --wd 0 --clip 1 --schedule interleaved -p 4 -v 2 --save "$tmp.nowd" > "$tmp.out" 2>&1
    check "--wd 0.1 decays: other weights than --wd 0" "[ \$? -eq 0 ] && ! cmp -s '$tmp.nowd' '$tmp.noeval'"
    "$cpu" $o --eval-every -1 > "$tmp.out" 2>&1
    check "--eval-every -1 is refused" "[ \$? -eq 2 ] && grep -q 'want values >= 0' '$tmp.out'"
    "$cpu" $o --eval-every 1 --eval-seqs 3 > "$tmp.out" 2>&1
    check "fewer held-out documents than m are refused" "[ \$? -ne 0 ] && grep -q '3 held-out documents, fewer than m = 4' '$tmp.out'"
else
    "$@" -np 2 "$mpi" $o $t --schedule 1f1b --eval-every 2 --check > "$tmp.mpi" 2>&1
    check "two MPI ranks with --eval-every 2 --check: exit 0" "[ \$? -eq 0 ]" || cat "$tmp.mpi"
    check "over MPI: the first evaluation = pp_sequential_eval, bit for bit" \
        "grep -q 'check: val loss after 2 steps .* bit-identical (0 of 4 batches differ)' '$tmp.mpi'"
    check "over MPI: gpt_cpu's val losses" "[ -n \"\$(vals '$tmp.mpi')\" ] && [ \"\$(vals '$tmp.mpi')\" = \"\$(vals '$tmp.p4')\" ]"
fi
finish
