#!/bin/sh
# Boundaries split over the TP group against whole ones: gpt_mpi --tp 2 at pp 2 (4 processes),
# with the split (the default: each TP rank sends 1/tp of a boundary's rows, the next stage
# all-gathers them) and with --tp-whole (each TP rank sends the whole tensor), one after the other
# RUNS times each (split, whole, split, ...). Prints, per run and as medians, tokens/s and the
# tensor bytes between stages, and the medians' ratios (split / whole).
#   sh bench/tp_split.sh [RUNS] [gpt_mpi args]     (build/gpt_mpi; mpirun)
runs=${1:-5}
[ $# -gt 0 ] && shift
B=${B:-build}
args=${*:-"--generated --dim 128 --heads 4 --layers 4 --max-len 64 --seqs-per-step 16 -m 8 --steps 20"}
mpirun_args="--oversubscribe"
[ "$(id -u)" = 0 ] && mpirun_args="$mpirun_args --allow-run-as-root"
tmp=${TMPDIR:-/tmp}/pp-tp-split.$$
mkdir -p "$tmp" || exit 1
trap 'rm -rf "$tmp"' EXIT
one() { # one MODE FLAG: tokens/s and tensor bytes of one run, appended to $tmp/MODE
  mpirun $mpirun_args -np 4 "$B/gpt_mpi" $args --tp 2 $2 > "$tmp/out" 2>&1 || { cat "$tmp/out"; exit 1; }
  tps=$(sed -n 's/.* \([0-9.]*\) tokens\/s.*/\1/p' "$tmp/out")
  by=$(sed -n 's/.*tensors ([a-z0-9]*): \([0-9]*\) bytes.*/\1/p' "$tmp/out")
  echo "$tps $by" >> "$tmp/$1"
  printf '%-6s %10s tokens/s %12s tensor bytes\n' "$1" "$tps" "$by"
}
median() { sort -n | awk '{ v[NR] = $1 } END { print NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
echo "# gpt_mpi --tp 2, pp 2 (4 processes): $args"
i=0
while [ $i -lt "$runs" ]; do one split ""; one whole --tp-whole; i=$((i + 1)); done
st=$(cut -d' ' -f1 "$tmp/split" | median); wt=$(cut -d' ' -f1 "$tmp/whole" | median)
sb=$(cut -d' ' -f2 "$tmp/split" | median); wb=$(cut -d' ' -f2 "$tmp/whole" | median)
echo "# median of $runs    tokens/s    tensor bytes between stages"
printf '%-16s %10s %14s\n' split "$st" "$sb" whole "$wt" "$wb"
awk -v a="$st" -v b="$wt" -v c="$sb" -v d="$wb" 'BEGIN { printf "%-16s %10.3f %14.3f\n", "split / whole", a / b, c / d }'
