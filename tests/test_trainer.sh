#!/bin/sh
# tests/test_trainer.sh GPT_CPU [GPT_MPI MPIRUN...] - the loop around the step in the GPT
# trainers (examples/gpt_train.h): the held-out split evaluated with forward-only steps
# (--eval-every) prints "val loss", equals pp_sequential_eval bit for bit (--check) and the same
# at every p and schedule; an evaluation changes nothing of the training (the checkpoint after
# a run with evaluations is the one without, byte for byte); AdamW's decay and the warm-up's
# rates show; bad values are refused. With GPT_MPI and an mpirun command, the same evaluation
# over two MPI ranks, against gpt_cpu's lines (also in bf16). --dtype bf16 (bf16 activations between layers):
# pipelined = sequential bit for bit, half the f32 run's tensor bytes in as many messages, a
# loss after 40 steps within 0.02 of f32's and not its bits (build/bf16-controls runs this part
# alone, TRAINER_PART=bf16, on a gpt_cpu whose --dtype bf16 stays f32, and it must fail).
# --dp 2 (two replicas in one process): the replicas' mean equals the sequential model's on each
# half of the step's sequences, bit for bit; --dp 1 is the program without it. --tp 2 (the layers
# split over two TP ranks' threads, also with --dp 2): pipelined = sequential at tp 2, within 1e-5
# of tp 1, the same bits across kinds and p, checkpoints in the tp 1 layout.
# Prints "NAME: N passed, N failed".
kind=trainer
. "${0%/*}/gpt_script.sh"
vals() { grep '^val loss' "$1" | sed 's/  (.*//'; } # the val loss lines without their timing
tensors() { sed -n 's/^sent in .* tensors ([a-z0-9]*): \([0-9]*\) bytes in \([0-9]*\) messages.*/\1 \2/p' "$1"; }
losses() { grep '^step' "$1" | awk '{ print $4 }'; } # every step's loss
last() { sed -n 's/^loss [0-9.]* -> \([0-9.]*\) .*/\1/p' "$1"; }
peak() { sed -n 's/^activations: peak \([0-9.]*\) MiB.*/\1/p' "$1"; }
recompute() { # --recompute K: the same bits with less stashed (build/recompute-controls runs this
    # part alone, TRAINER_PART=recompute, on a gpt_cpu whose B skips the recompute: it must fail)
    r="--generated --layers 6 --dim 32 --heads 2 --max-len 32 --seqs-per-step 16 -m 8 --steps 3"
    "$cpu" $r -p 4 > "$tmp.r0" 2>&1 && "$cpu" $r -p 4 --recompute 1 --check > "$tmp.r1" 2>&1
    check "--recompute 1, 1F1B p = 4 --check: exit 0" "[ \$? -eq 0 ]" || cat "$tmp.r1"
    check "--recompute 1: pipelined = sequential, bit for bit" "grep -q 'check: step 0 loss .* bit-identical; gradients: 0 layers differ' '$tmp.r1'"
    check "--recompute 1: every step's loss that of the run without" "[ -n \"\$(losses '$tmp.r0')\" ] && [ \"\$(losses '$tmp.r0')\" = \"\$(losses '$tmp.r1')\" ]"
    p0=$(peak "$tmp.r0"); p1=$(peak "$tmp.r1")
    check "--recompute 1 stashes less on the fullest rank ($p1 MiB, without: $p0 MiB)" "[ -n '$p1' ] && awk 'BEGIN { exit !($p1 < $p0 * 0.7) }' && grep -q 'recomputing 6 of 8 layers' '$tmp.r1'"
    "$cpu" $r --schedule zb-h1 -p 2 --recompute 2 --check > "$tmp.rz" 2>&1
    check "--recompute 2, ZB-H1 p = 2 (split backward): bit-identical to sequential" "[ \$? -eq 0 ] && grep -q 'check: step 0 loss .* bit-identical; gradients: 0 layers differ' '$tmp.rz'"
    "$cpu" $r --schedule interleaved -p 2 -v 2 --recompute 2 --dtype bf16 --check > "$tmp.ri" 2>&1
    check "--recompute 2, interleaved p = 2 in bf16: bit-identical to sequential" "[ \$? -eq 0 ] && grep -q 'check: step 0 loss .* bit-identical; gradients: 0 layers differ' '$tmp.ri'"
    "$cpu" $r --recompute -1 > "$tmp.out" 2>&1
    check "--recompute -1 is refused" "[ \$? -ne 0 ] && grep -q 'recompute >= 0' '$tmp.out'"
}
bf16() { # the --dtype bf16 part
    b="--generated --layers 6 --dim 16 --heads 2 --max-len 24 --seqs-per-step 12 -m 4"
    "$cpu" $b --steps 3 --dtype bf16 --schedule interleaved -p 4 -v 2 --check --eval-every 3 --eval-seqs 48 > "$tmp.bf" 2>&1
    check "--dtype bf16, interleaved p = 4 --check: exit 0" "[ \$? -eq 0 ]" || cat "$tmp.bf"
    check "bf16: pipelined step = sequential, bit for bit" "grep -q 'check: step 0 loss .* bit-identical; gradients: 0 layers differ' '$tmp.bf'"
    check "bf16: pipelined evaluation = sequential, bit for bit" "grep -q 'check: val loss .* bit-identical' '$tmp.bf'"
    "$cpu" $b --steps 3 --dtype bf16 --schedule zb-h1 -p 2 --check > "$tmp.bz" 2>&1
    check "bf16, ZB-H1 p = 2 (split backward): bit-identical to sequential" "[ \$? -eq 0 ] && grep -q 'check: step 0 loss .* bit-identical; gradients: 0 layers differ' '$tmp.bz'"
    "$cpu" $b --steps 40 --dtype f32 -p 2 > "$tmp.f32" 2>&1 && "$cpu" $b --steps 40 --dtype bf16 -p 2 > "$tmp.b16" 2>&1
    check "40 steps in f32 and bf16 at 1F1B p = 2: exit 0" "[ \$? -eq 0 ]"
    set -- $(tensors "$tmp.f32") $(tensors "$tmp.b16")
    check "bf16 sends half the f32 run's tensor bytes ($3 of $1) in as many messages ($4, $2)" "[ -n '$4' ] && [ \$(($3 * 2)) -eq '$1' ] && [ '$4' -eq '$2' ]"
    fl=$(last "$tmp.f32"); bl=$(last "$tmp.b16")
    check "bf16's loss after 40 steps $bl within 0.02 of f32's $fl, not its bits" \
        "[ -n '$bl' ] && awk 'BEGIN { d = $bl - $fl; exit !(d < 0.02 && d > -0.02) }' && [ \"\$(losses '$tmp.f32')\" != \"\$(losses '$tmp.b16')\" ]"
    "$cpu" $b --dtype f16 > "$tmp.out" 2>&1
    check "--dtype f16 is refused" "[ \$? -eq 2 ] && grep -q \"unknown --dtype 'f16'\" '$tmp.out'"
}
dp() { # --dp 2: two data-parallel replicas of the pipeline in one process (pp_pipeline_desc.dp;
    # build/tp-controls runs this part alone, TRAINER_PART=dp, on a gpt_cpu whose step skips the
    # dp sum: it must fail)
    b="--generated --layers 6 --dim 16 --heads 2 --max-len 24 --seqs-per-step 16 -m 4 --steps 3"
    "$cpu" $b --schedule interleaved -p 2 -v 2 --dp 2 --check --eval-every 3 --eval-seqs 48 > "$tmp.dp" 2>&1
    check "--dp 2, interleaved p = 2 --check: exit 0" "[ \$? -eq 0 ] && grep -q 'data parallel: 2 replicas of the pipeline (4 threads)' '$tmp.dp'" || cat "$tmp.dp"
    check "--dp 2: the replicas' mean = the sequential model's on each half, bit for bit" "grep -q 'check: step 0 loss .* bit-identical; gradients: 0 layers differ' '$tmp.dp'"
    check "--dp 2: the evaluation = pp_sequential_eval, bit for bit" "grep -q 'check: val loss .* bit-identical' '$tmp.dp'"
    "$cpu" $b --schedule zb-h1 -p 1 --dp 2 --check > "$tmp.dpz" 2>&1
    check "--dp 2, ZB-H1 p = 1 (split backward): the expected bits" "[ \$? -eq 0 ] && grep -q 'check: step 0 loss .* bit-identical; gradients: 0 layers differ' '$tmp.dpz'" || cat "$tmp.dpz"
    check "--dp 2 trains on the same loss at p = 1 and p = 2" "[ -n \"\$(losses '$tmp.dpz')\" ] && [ \"\$(losses '$tmp.dp')\" = \"\$(losses '$tmp.dpz')\" ]"
    "$cpu" $b --schedule 1f1b -p 2 > "$tmp.dp0" 2>&1 && "$cpu" $b --schedule 1f1b -p 2 --dp 1 > "$tmp.dp1" 2>&1
    check "--dp 1 is the program without it (every step's loss)" "[ \$? -eq 0 ] && [ -n \"\$(losses '$tmp.dp0')\" ] && [ \"\$(losses '$tmp.dp0')\" = \"\$(losses '$tmp.dp1')\" ]"
    "$cpu" $b --dp 3 -m 8 > "$tmp.out" 2>&1
    check "--dp 3 with 16 sequences and m = 8 is refused" "[ \$? -eq 2 ] && grep -q -- '--dp 3: need' '$tmp.out'"
}
tp() { # --tp 2: every stage's layers split over two TP ranks' threads (pp_pipeline_desc.tp, the
    # blocks' all-reduces over io->tp; build/tp-controls runs this part alone, TRAINER_PART=tp, on a
    # gpt_cpu whose blocks skip the attention projection's row-parallel all-reduce: it must fail)
    t="--generated --dim 32 --heads 4 --layers 2 --max-len 32 --seqs-per-step 8 -m 4 --steps 3 --clip 1"
    "$cpu" $t --tp 1 -p 2 > "$tmp.t1" 2>&1
    check "--tp 1, 1F1B p = 2: exit 0" "[ \$? -eq 0 ]" || cat "$tmp.t1"
    l1=$(tpline "$tmp.t1")
    "$cpu" $t --tp 2 -p 2 --check > "$tmp.t2" 2>&1
    check "--tp 2, 1F1B p = 2 --check: exit 0" "[ \$? -eq 0 ] && grep -q 'tensor parallel: .* 2 TP ranks .* 4 threads' '$tmp.t2'" || cat "$tmp.t2"
    check "--tp 2: pipelined = sequential at tp 2, bit for bit" "grep -q 'check: step 0 loss .* bit-identical; gradients: 0 layers differ' '$tmp.t2'"
    check "--tp 2: step 0's loss and gradients within 1e-5 of tp 1 ($(sed -n 's/^check: tp 2 against tp 1 on step 0: \(.*\) relative.*/\1/p' "$tmp.t2"))" \
        "grep -q 'check: tp 2 against tp 1 on step 0: .* ok\$' '$tmp.t2'"
    l2=$(tpline "$tmp.t2")
    check "--tp 2: 3 steps' losses and clipped norms within 1e-5 (relative) of tp 1's" "tpclose '$l2' '$l1'"
    "$cpu" $t --tp 2 -p 2 --dp 2 --check --eval-every 3 --eval-seqs 48 > "$tmp.t2d" 2>&1
    check "--tp 2 --dp 2 (8 threads) --check: exit 0, tp 2 = sequential, within 1e-5 of tp 1" \
        "[ \$? -eq 0 ] && grep -q 'check: step 0 loss .* bit-identical; gradients: 0 layers differ' '$tmp.t2d' && grep -q 'check: tp 2 against tp 1 on step 0: .* ok\$' '$tmp.t2d' && grep -q 'check: val loss .* bit-identical' '$tmp.t2d'" || cat "$tmp.t2d"
    "$cpu" $t --tp 2 -p 2 > "$tmp.t2b" 2>&1
    check "--tp 2: the same bits run to run" "[ -n '$l2' ] && [ \"\$(tpline '$tmp.t2b')\" = '$l2' ]"
    for k in "interleaved -p 2 -v 2" "zb-h1 -p 2" "gpipe -p 1"; do
        "$cpu" $t --tp 2 --schedule $k > "$tmp.t2k" 2>&1
        check "--tp 2: the same bits (losses, norms) at $k" "[ -n '$l2' ] && [ \"\$(tpline '$tmp.t2k')\" = '$l2' ]"
    done
    # --save at tp 2 writes the tp 1 layout; --resume at tp 2, p 1 continues bit for bit, at tp 1 within 1e-5
    "$cpu" $t --tp 2 -p 2 --steps 4 > "$tmp.c4" 2>&1
    full=$(tpline "$tmp.c4" | awk '{ print $3, $4, "norms", $8, $9 }')
    "$cpu" $t --tp 2 -p 2 --steps 2 --save "$tmp.ck" > "$tmp.out" 2>&1
    "$cpu" $t --tp 2 --schedule gpipe -p 1 --steps 4 --resume "$tmp.ck" > "$tmp.cr" 2>&1
    check "--tp 2 --save, --resume at p 1 (GPipe): steps 2 and 3 bit for bit the run's without a stop" "[ -n '$full' ] && [ \"\$(tpline '$tmp.cr')\" = '$full' ]"
    "$cpu" $t --tp 1 -p 2 --steps 4 --resume "$tmp.ck" > "$tmp.cr1" 2>&1
    check "the tp 2 file resumed at tp 1: within 1e-5" "[ -n '$full' ] && tpclose \"\$(tpline '$tmp.cr1')\" '$full'"
    "$cpu" $t --tp 3 > "$tmp.out" 2>&1
    check "--tp 3 with 4 heads is refused" "[ \$? -eq 2 ] && grep -q -- '--tp 3: the heads (--heads 4) and the vocabulary (256) must split evenly' '$tmp.out'"
}
. "${0%/*}/tp_lines.sh"
if [ "$TRAINER_PART" = tp ]; then
    name="$name tp"
    tp
    finish
    exit
fi
if [ "$TRAINER_PART" = dp ]; then
    name="$name dp"
    dp
    finish
    exit
fi
if [ "$TRAINER_PART" = bf16 ]; then
    name="$name bf16"
    bf16
    finish
    exit
fi
if [ "$TRAINER_PART" = recompute ]; then
    name="$name recompute"
    recompute
    finish
    exit
fi
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
    bf16
    recompute
    dp
    tp
else
    "$@" -np 2 "$mpi" $o $t --schedule 1f1b --eval-every 2 --check > "$tmp.mpi" 2>&1
    check "two MPI ranks with --eval-every 2 --check: exit 0" "[ \$? -eq 0 ]" || cat "$tmp.mpi"
    check "over MPI: the first evaluation = pp_sequential_eval, bit for bit" \
        "grep -q 'check: val loss after 2 steps .* bit-identical (0 of 4 batches differ)' '$tmp.mpi'"
    check "over MPI: gpt_cpu's val losses" "[ -n \"\$(vals '$tmp.mpi')\" ] && [ \"\$(vals '$tmp.mpi')\" = \"\$(vals '$tmp.p4')\" ]"
    b="--generated --layers 6 --dim 16 --heads 2 --max-len 24 --seqs-per-step 12 -m 4 --steps 3 --dtype bf16"
    "$@" -np 2 "$mpi" $b --schedule 1f1b --check > "$tmp.mb" 2>&1
    check "over MPI with --dtype bf16: pipelined = sequential, bit for bit" "[ \$? -eq 0 ] && grep -q 'check: step 0 loss .* bit-identical; gradients: 0 layers differ' '$tmp.mb'" || cat "$tmp.mb"
    "$cpu" $b --schedule 1f1b -p 2 > "$tmp.cb" 2>&1
    "$@" -np 2 "$mpi" $b --schedule 1f1b --recompute 1 --check > "$tmp.mr" 2>&1
    check "over MPI with --recompute 1: pipelined = sequential, bit for bit" "[ \$? -eq 0 ] && grep -q 'check: step 0 loss .* bit-identical; gradients: 0 layers differ' '$tmp.mr' && grep -q 'recomputing 6 of 8 layers' '$tmp.mr'" || cat "$tmp.mr"
    t="--generated --dim 32 --heads 4 --layers 2 --max-len 32 --seqs-per-step 8 -m 4 --steps 3 --clip 1"
    "$cpu" $t --tp 2 -p 2 > "$tmp.ct" 2>&1 && "$@" -np 4 "$mpi" $t --tp 2 > "$tmp.mt" 2>&1
    check "over MPI --tp 2 (pp 2 x tp 2): gpt_cpu --tp 2's losses and clipped norms, bit for bit" "[ \$? -eq 0 ] && [ -n \"\$(tpline '$tmp.ct')\" ] && [ \"\$(tpline '$tmp.ct')\" = \"\$(tpline '$tmp.mt')\" ]"
    check "over MPI with --dtype bf16: gpt_cpu's losses and tensor bytes" "[ -n \"\$(tensors '$tmp.mb')\" ] && [ \"\$(tensors '$tmp.mb')\" = \"\$(tensors '$tmp.cb')\" ] && [ \"\$(losses '$tmp.mb')\" = \"\$(losses '$tmp.cb')\" ]"
fi
finish
