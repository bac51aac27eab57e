#!/bin/sh
# tests/test_cuda_trainer.sh GPT_CUDA [GPT_CPU] - the training loop of examples/gpt_cuda.cu, run
# with --cpu (the same layer code and optimizer kernels on the host; make check-cuda): checkpoints
# saved at p = 4 interleaved and resumed at p = 2 1F1B give the uninterrupted run's bits
# (--check-resume, with a warm-up, a cosine, AdamW's decay and clipping); a checkpoint does not
# depend on p or the schedule; --eval-every prints "val loss", the same at every p and schedule,
# and changes nothing of the training; --clip and --wd change the update (a clip above the norm
# does not); truncated, corrupted, foreign and other-shape files are refused; bad values are
# refused. PART=resume runs the --check-resume part alone (build/cuda-trainer-controls runs it on
# a gpt_cuda whose resume leaves Adam's moments out, and it must fail). With GPT_CPU, a gpt_cpu
# checkpoint (another model) is refused too. TRAINER_GPU=1 runs it all on the GPU (no --cpu:
# tools/gpu_run.sh). Prints "cuda-trainer: N passed, N failed".
cuda=${1:-build/gpt_cuda}
cpu=$2
tmp=${TMPDIR:-/tmp}/pp-cuda-trainer-test.$$
pass=0; fail=0
check() { # check WHAT COND
    if eval "$2"; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL $1"; return 1; fi
}
vals() { grep '^val loss' "$1" | sed 's/  (.*//'; } # the val loss lines without their timing
peak() { sed -n 's/^activations: peak \([0-9.]*\) MiB.*/\1/p' "$1"; } # the most MiB one rank stashed
dev=--cpu
[ "$TRAINER_GPU" = 1 ] && dev=
o="$dev --generated --layers 6 --dim 16 --heads 2 --max-len 24 --seqs-per-step 12 -m 4 --steps 12"
"$cuda" $o --warmup 3 --lr-min 3e-4 --wd 0.1 --clip 0.5 --schedule interleaved -p 4 -v 2 --check-resume > "$tmp.out" 2>&1
check "--check-resume (warm-up, cosine, AdamW, clip): exit 0 and bit-identical" \
    "[ \$? -eq 0 ] && grep -q 'losses bit-identical, final weights bit-identical against p=2 uninterrupted -> OK' '$tmp.out'" ||
    cat "$tmp.out"
if [ "$PART" != resume ]; then
    w="--warmup 3 --wd 0.1"
    "$cuda" $o $w --schedule interleaved -p 4 -v 2 --save "$tmp.p4" > "$tmp.out" 2>&1
    check "saved at p = 4 interleaved" "[ \$? -eq 0 ] && [ -s '$tmp.p4' ] && [ ! -e '$tmp.p4.tmp' ] && grep -q 'saved .* after 12 steps' '$tmp.out'"
    "$cuda" $o $w --schedule 1f1b -p 2 --save "$tmp.p2" > "$tmp.out" 2>&1
    check "the same run at p = 2 1F1B saves the same bytes" "[ \$? -eq 0 ] && cmp -s '$tmp.p4' '$tmp.p2'"
    check "the progress line: step/steps, loss, lr, tokens, tok/s" \
        "grep -q '^step   1/12  loss [0-9.]*  lr 6.67e-04 .* tokens .* tok/s  bubble' '$tmp.out'"
    "$cuda" $o $w --schedule 1f1b -p 2 --eval-every 4 --eval-seqs 40 --save "$tmp.ev" > "$tmp.e2" 2>&1
    check "--eval-every 4: three val loss lines" "[ \$? -eq 0 ] && [ \$(grep -c '^val loss [0-9.]* after' '$tmp.e2') -eq 3 ]"
    check "an evaluation changes nothing of the training (checkpoints equal)" "cmp -s '$tmp.ev' '$tmp.p2'"
    "$cuda" $o $w --schedule interleaved -p 4 -v 2 --eval-every 4 --eval-seqs 40 > "$tmp.e4" 2>&1
    check "val loss at p = 4 interleaved = at p = 2 1F1B, bit for bit" "[ -n \"\$(vals '$tmp.e4')\" ] && [ \"\$(vals '$tmp.e4')\" = \"\$(vals '$tmp.e2')\" ]"
    "$cuda" $o $w -p 2 --clip 0.5 --save "$tmp.c" > "$tmp.out" 2>&1
    check "--clip 0.5 prints the norm and changes the update" \
        "[ \$? -eq 0 ] && grep -q 'grad norm [0-9.]*\$' '$tmp.out' && ! cmp -s '$tmp.c' '$tmp.p2'"
    "$cuda" $o $w -p 2 --clip 1e6 --save "$tmp.c" > "$tmp.out" 2>&1
    check "--clip above every norm leaves the update alone" "[ \$? -eq 0 ] && cmp -s '$tmp.c' '$tmp.p2'"
    "$cuda" $o --warmup 3 -p 2 --save "$tmp.c" > "$tmp.out" 2>&1
    check "--wd 0.1 changes the update (AdamW)" "[ \$? -eq 0 ] && ! cmp -s '$tmp.c' '$tmp.p2'"
    head -c 5000 "$tmp.p4" > "$tmp.bad"
    "$cuda" $o -p 2 --resume "$tmp.bad" > "$tmp.out" 2>&1
    check "a truncated file is refused" "[ \$? -ne 0 ] && grep -q 'corrupt data: truncated' '$tmp.out'"
    cp "$tmp.p4" "$tmp.bad"
    printf 'X' | dd of="$tmp.bad" bs=1 seek=6000 conv=notrunc 2>/dev/null
    "$cuda" $o -p 2 --resume "$tmp.bad" > "$tmp.out" 2>&1
    check "a flipped byte is refused" "[ \$? -ne 0 ] && grep -q 'checksum' '$tmp.out'"
    "$cuda" $o --dim 8 -p 2 --resume "$tmp.p4" > "$tmp.out" 2>&1
    check "another model (--dim 8) is refused" "[ \$? -ne 0 ] && grep -q 'size mismatch: layer 0 (embed) buffer 0' '$tmp.out'"
    "$cuda" $o --layers 5 -p 2 --resume "$tmp.p4" > "$tmp.out" 2>&1
    check "another depth is refused" "[ \$? -ne 0 ] && grep -q 'has 8 layers, this model 7' '$tmp.out'"
    "$cuda" $o -p 2 --resume "$0" > "$tmp.out" 2>&1
    check "a file that is not a checkpoint is refused" "[ \$? -ne 0 ] && grep -q 'not a pipeline.h checkpoint' '$tmp.out'"
    if [ -n "$cpu" ]; then
        "$cpu" --generated --layers 6 --dim 16 --heads 2 --max-len 24 --seqs-per-step 12 -m 4 --steps 2 -p 2 --save "$tmp.gpt" > "$tmp.out" 2>&1
        "$cuda" $o -p 2 --resume "$tmp.gpt" > "$tmp.out" 2>&1
        check "gpt_cpu's checkpoint (another model) is refused" "[ \$? -ne 0 ] && grep -q 'resume' '$tmp.out'" && grep 'resume' "$tmp.out" | head -1
    fi
    # --recompute K: the same bits as the unpipelined run (--check), less stashed on the fullest rank
    "$cuda" $o -p 4 --steps 3 > "$tmp.r0" 2>&1 && "$cuda" $o -p 4 --steps 3 --recompute 1 --check > "$tmp.r1" 2>&1
    check "--recompute 1, 1F1B p = 4 --check: bit-identical to unpipelined" "[ \$? -eq 0 ] && grep -q 'loss curve bit-identical, final weights bit-identical' '$tmp.r1'"
    p0=$(peak "$tmp.r0"); p1=$(peak "$tmp.r1")
    check "--recompute 1 stashes less ($p1 MiB, without: $p0 MiB)" "[ -n '$p1' ] && awk 'BEGIN { exit !($p1 < $p0 * 0.7) }'"
    "$cuda" $o --schedule interleaved -p 2 -v 2 --steps 3 --recompute 2 --check > "$tmp.r2" 2>&1
    check "--recompute 2, interleaved p = 2: bit-identical to unpipelined" "[ \$? -eq 0 ] && grep -q 'loss curve bit-identical, final weights bit-identical' '$tmp.r2'"
    for bad in "--clip -1" "--wd -0.1" "--warmup -1" "--eval-every -2" "--eval-seqs 0" "--recompute -1"; do
        "$cuda" $o -p 2 $bad > "$tmp.out" 2>&1
        check "$bad is refused" "[ \$? -ne 0 ]"
    done
fi
rm -f "$tmp".*
echo "cuda-trainer: $pass passed, $fail failed"
[ $fail -eq 0 ]
