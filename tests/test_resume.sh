#!/bin/sh
# tests/test_resume.sh GPT_CPU [GPT_MPI MPIRUN...] - checkpoints through the GPT trainers: saved at
# p = 4 interleaved, resumed at p = 2 1F1B, bit for bit what an uninterrupted run gives (the
# saved files compared with cmp: weights, Adam's moments, step; the learning rate warms up and
# decays, so the resumed run must take its step from the file); a truncated file, a flipped byte,
# another model and a file that is not a checkpoint refused. With GPT_MPI and an mpirun command,
# the same across processes: four ranks write one file together (the same bytes as gpt_cpu's),
# two ranks resume from it. Prints "NAME: N passed, N failed".
kind=resume
. "${0%/*}/gpt_script.sh"
# AdamW with a warm-up (examples/gpt_train.h's gpt_lr): a resumed run must find its place on
# the schedule from the checkpoint's step. --check-resume adds the cosine, which ends at --steps
# (a run of --steps 6 has another cosine than the first half of one of --steps 12).
o="--generated --layers 6 --dim 16 --heads 2 --max-len 24 --seqs-per-step 12 -m 4 --warmup 3 --wd 0.1"
if [ -z "$mpi" ]; then
    "$cpu" $o --lr-min 3e-4 --check-resume --schedule interleaved -p 4 -v 2 --steps 12 > "$tmp.out" 2>&1
    check "--check-resume: exit 0 and bit-identical" \
        "[ \$? -eq 0 ] && grep -q 'weights bit-identical, optimizer moments bit-identical' '$tmp.out'"
fi
"$cpu" $o --schedule interleaved -p 4 -v 2 --steps 6 --save "$tmp.half" > "$tmp.out" 2>&1
check "saved at p = 4 interleaved" "[ \$? -eq 0 ] && [ -s '$tmp.half' ] && [ ! -e '$tmp.half.tmp' ]"
"$cpu" $o --schedule zb-h1 -p 2 --steps 12 --save "$tmp.ref" > "$tmp.out" 2>&1
check "12 steps at p = 2 ZB-H1 uninterrupted" "[ \$? -eq 0 ]"
if [ -z "$mpi" ]; then
    "$cpu" $o --schedule 1f1b -p 2 --steps 12 --resume "$tmp.half" --save "$tmp.res" > "$tmp.out" 2>&1
    check "resumed at p = 2 1F1B" "[ \$? -eq 0 ] && grep -q 'resumed from .* at step 6' '$tmp.out'"
    check "resumed = uninterrupted, byte for byte" "cmp -s '$tmp.res' '$tmp.ref'"
    head -c 5000 "$tmp.half" > "$tmp.bad"
    "$cpu" $o -p 2 --steps 12 --resume "$tmp.bad" > "$tmp.out" 2>&1
    check "a truncated file is refused" "[ \$? -ne 0 ] && grep -q 'corrupt data: truncated' '$tmp.out'"
    cp "$tmp.half" "$tmp.bad"
    printf 'X' | dd of="$tmp.bad" bs=1 seek=6000 conv=notrunc 2>/dev/null
    "$cpu" $o -p 2 --steps 12 --resume "$tmp.bad" > "$tmp.out" 2>&1
    check "a flipped byte is refused" "[ \$? -ne 0 ] && grep -q 'checksum' '$tmp.out'"
    "$cpu" $o --dim 8 -p 2 --steps 12 --resume "$tmp.half" > "$tmp.out" 2>&1
    check "another model (--dim 8) is refused" "[ \$? -ne 0 ] && grep -q 'size mismatch: layer 0 (embed) buffer 0' '$tmp.out'"
    "$cpu" $o --layers 5 -p 2 --steps 12 --resume "$tmp.half" > "$tmp.out" 2>&1
    check "another depth is refused" "[ \$? -ne 0 ] && grep -q 'has 8 layers, this model 7' '$tmp.out'"
    "$cpu" $o -p 2 --steps 12 --resume "$0" > "$tmp.out" 2>&1
    check "a file that is not a checkpoint is refused" "[ \$? -ne 0 ] && grep -q 'not a pipeline.h checkpoint' '$tmp.out'"
else
    "$@" -np 4 "$mpi" $o --schedule interleaved -v 2 --steps 6 --save "$tmp.mhalf" > "$tmp.out" 2>&1
    check "four MPI ranks saved one file" "[ \$? -eq 0 ] && [ -s '$tmp.mhalf' ]" || cat "$tmp.out"
    check "the ranks' file = gpt_cpu's at p = 4, byte for byte" "cmp -s '$tmp.mhalf' '$tmp.half'"
    "$@" -np 2 "$mpi" $o --schedule 1f1b --steps 12 --resume "$tmp.mhalf" --save "$tmp.mres" > "$tmp.out" 2>&1
    check "two MPI ranks resumed and saved" "[ \$? -eq 0 ] && grep -q 'resumed from' '$tmp.out'" || cat "$tmp.out"
    check "resumed over MPI = uninterrupted, byte for byte" "cmp -s '$tmp.mres' '$tmp.ref'"
fi
finish
