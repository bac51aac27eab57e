#!/bin/sh
# tests/test_gpt_tp.sh GPT_MPI MPIRUN... - the packed-sequence GPT with Megatron-style tensor
# parallelism (examples/gpt.h TENSOR PARALLELISM, gpt_mpi --tp N) over MPI:
#   - tp 2 (pp 2) and tp 4 (pp 1) --check: pipelined = sequential at that tp, bit for bit, and the
#     step-0 loss and every gradient buffer within 1e-5 (relative) of the tp 1 model in-process;
#   - every step's loss and clipped-norm of 3 steps within 1e-5 (relative) of the tp 1 run's;
#   - at fixed tp the same bits (losses and norms) run to run, across schedule kinds (1F1B, GPipe,
#     ZB-H1 with its split backward, interleaved) and p (1 and 2);
#   - the boundaries split over the TP group: the same bits as --tp-whole with half its tensor
#     bytes between stages at tp 2;
#   - a checkpoint saved at tp 2 (the tp 1 layout) resumed at tp 2 continues bit for bit (p 2 and
#     1), resumed at tp 1 and tp 4 within 1e-5.
# Its negative control (build/mpi-gpt-tp-controls): a gpt_mpi whose blocks skip the attention
# projection's row-parallel all-reduce must fail --check at tp 2.
# Prints "mpi-gpt-tp: N passed, N failed".
mpi=$1
shift
tmp=${TMPDIR:-/tmp}/pp-gpt-tp-test.$$
pass=0; fail=0
check() { # check WHAT COND
    if eval "$2"; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL $1"; return 1; fi
}
args="--generated --dim 32 --heads 4 --layers 2 --max-len 32 --seqs-per-step 8 -m 4 --steps 3 --clip 1"
run() { # run OUT NP ARGS...: gpt_mpi on NP processes; its exit status
    out=$1; np=$2; shift 2
    timeout 120 "$mpirun_cmd" $mpirun_args -np "$np" "$mpi" $args "$@" > "$out" 2>&1
}
mpirun_cmd=$1
shift
mpirun_args="$*"
. "${0%/*}/tp_lines.sh"

run "$tmp.t1" 2 --tp 1 --check
check "tp 1 (pp 2) --check: exit 0" "[ \$? -eq 0 ]" || cat "$tmp.t1"
l1=$(tpline "$tmp.t1")

run "$tmp.t2" 4 --tp 2 --check
check "tp 2 (pp 2, 1F1B) --check: exit 0" "[ \$? -eq 0 ]" || cat "$tmp.t2"
check "tp 2: pipelined = sequential at tp 2, bit for bit" "grep -q 'check: step 0 loss .* bit-identical; gradients: 0 layers differ' '$tmp.t2'"
check "tp 2: step 0's loss and gradients within 1e-5 of tp 1 ($(sed -n 's/^check: tp 2 against tp 1 on step 0: \(.*\) relative.*/\1/p' "$tmp.t2"))" \
    "grep -q 'check: tp 2 against tp 1 on step 0: .* ok\$' '$tmp.t2'"
l2=$(tpline "$tmp.t2")
check "tp 2: 3 steps' losses and norms within 1e-5 (relative) of tp 1's" "tpclose '$l2' '$l1'"

run "$tmp.t2b" 4 --tp 2
check "tp 2: the same bits run to run" "[ -n '$l2' ] && [ \"\$(tpline '$tmp.t2b')\" = '$l2' ]"
run "$tmp.t2c" 2 --tp 2 --schedule gpipe
check "tp 2: the same bits at p 1 (GPipe)" "[ -n '$l2' ] && [ \"\$(tpline '$tmp.t2c')\" = '$l2' ]"
run "$tmp.t2d" 4 --tp 2 --schedule zb-h1
check "tp 2: the same bits at p 2 ZB-H1 (split backward)" "[ -n '$l2' ] && [ \"\$(tpline '$tmp.t2d')\" = '$l2' ]"

# the boundaries split over the TP group (the default) against --tp-whole (each TP rank sent the
# whole tensor): the same bits, and half the tensor bytes between stages at tp 2
tbytes() { sed -n 's/.*tensors ([a-z0-9]*): \([0-9]*\) bytes.*/\1/p' "$1"; }
run "$tmp.t2w" 4 --tp 2 --tp-whole
check "tp 2 --tp-whole: the same bits as the split boundaries" "[ -n '$l2' ] && [ \"\$(tpline '$tmp.t2w')\" = '$l2' ]"
bs=$(tbytes "$tmp.t2b"); bw=$(tbytes "$tmp.t2w")
check "tp 2: the split sends half the tensor bytes of --tp-whole ($bs and $bw)" "[ -n '$bs' ] && [ -n '$bw' ] && [ \$((2 * bs)) -eq '$bw' ]"

run "$tmp.t4" 4 --tp 4 --check
check "tp 4 (pp 1) --check: exit 0" "[ \$? -eq 0 ]" || cat "$tmp.t4"
check "tp 4: step 0's loss and gradients within 1e-5 of tp 1 ($(sed -n 's/^check: tp 4 against tp 1 on step 0: \(.*\) relative.*/\1/p' "$tmp.t4"))" \
    "grep -q 'check: tp 4 against tp 1 on step 0: .* ok\$' '$tmp.t4'"
l4=$(tpline "$tmp.t4")
check "tp 4: 3 steps' losses and norms within 1e-5 (relative) of tp 1's" "tpclose '$l4' '$l1'"
run "$tmp.t4b" 8 --tp 4 --schedule interleaved -v 2
check "tp 4: the same bits at p 2 interleaved (v 2)" "[ -n '$l4' ] && [ \"\$(tpline '$tmp.t4b')\" = '$l4' ]"

# checkpoints: --save at tp 2 writes the tp 1 layout (TP rank 0 gathers its group's shards);
# --resume at tp 2 continues bit for bit (p 2 and p 1), at tp 1 and tp 4 within 1e-5
run "$tmp.c4" 4 --tp 2 --steps 4
full=$(tpline "$tmp.c4" | awk '{ print $3, $4, "norms", $8, $9 }') # steps 2 and 3 of the run without a stop
run "$tmp.cs" 4 --tp 2 --steps 2 --save "$tmp.ckpt"
check "tp 2 --save: exit 0" "[ \$? -eq 0 ] && [ -f '$tmp.ckpt' ]" || cat "$tmp.cs"
run "$tmp.cr" 4 --tp 2 --steps 4 --resume "$tmp.ckpt"
check "tp 2 --resume (p 2): steps 2 and 3 bit for bit those of the run without a stop" "[ -n '$full' ] && [ \"\$(tpline '$tmp.cr')\" = '$full' ]"
run "$tmp.cr1" 2 --tp 2 --steps 4 --schedule gpipe --resume "$tmp.ckpt"
check "tp 2 --resume at p 1 (GPipe): the same bits" "[ -n '$full' ] && [ \"\$(tpline '$tmp.cr1')\" = '$full' ]"
run "$tmp.crt1" 2 --tp 1 --steps 4 --resume "$tmp.ckpt"
check "the tp 2 file resumed at tp 1: within 1e-5" "[ -n '$full' ] && tpclose \"\$(tpline '$tmp.crt1')\" '$full'"
run "$tmp.crt4" 4 --tp 4 --steps 4 --resume "$tmp.ckpt"
check "the tp 2 file resumed at tp 4: within 1e-5" "[ -n '$full' ] && tpclose \"\$(tpline '$tmp.crt4')\" '$full'"

rm -f "$tmp".*
echo "mpi-gpt-tp: $pass passed, $fail failed"
[ $fail -eq 0 ]
