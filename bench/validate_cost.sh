#!/bin/sh
# The validation layer's cost (pipeline.h >>impl-validate): bench_overhead built with it (the
# default build) and without it (-DPP_NO_VALIDATE), run one after the other RUNS times each
# (on, off, on, off, ...). Prints, per figure, the median and the least with and without, and
# their ratios (on a shared machine the least is the least disturbed).
#   make bench-validate                                   (5 runs, a small MLP)
#   sh bench/validate_cost.sh RUNS [bench_overhead args]  (build/bench_overhead{,-novalidate})
runs=${1:-3}
[ $# -gt 0 ] && shift
B=${B:-build}
on=$B/bench_overhead
off=$B/bench_overhead-novalidate
tmp=${TMPDIR:-/tmp}/pp-validate-cost.$$
mkdir -p "$tmp" || exit 1
trap 'rm -rf "$tmp"' EXIT
# bench_overhead's output as "figure value" lines: ns/action of the empty layers per p, T_seq,
# and each schedule's T_pipe; the footer's OK/FAILED as "failed 0/1"
figures() {
  awk '/^# host overhead/ { t = 1 } /^# pipeline efficiency/ { t = 2; for (i = 1; i <= NF; i++) if ($i == "T_seq") print "T_seq_ms", $(i + 2) }
       t == 1 && $1 ~ /^[0-9]+$/ { print "empty_ns_per_action_p" $1, $5 }
       t == 2 && $2 ~ /^[0-9]+$/ { print "T_pipe_ms_" $1 "_p" $2, $5 }
       /^FAILED/ { print "failed", 1 }'
}
i=0
while [ $i -lt "$runs" ]; do
  for b in on off; do
    eval bin=\$$b
    "$bin" "$@" | figures > "$tmp/$b.$i" || exit 1
    if grep -q '^failed' "$tmp/$b.$i"; then echo "validate_cost: $bin FAILED"; exit 1; fi
  done
  i=$((i + 1))
done
# "median min" of the values on stdin (on a shared machine the least disturbed run is the min)
stat() { sort -n | awk '{ v[NR] = $1 } END { print ((NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2), v[1] }'; }
echo "# validation layer on / off (-DPP_NO_VALIDATE), $runs runs each, alternating: bench_overhead $*"
printf '%-28s %10s %10s %7s %10s %10s %7s\n' figure med_on med_off ratio min_on min_off ratio
for f in $(cut -d' ' -f1 "$tmp/on.0"); do
  a=$(cat "$tmp"/on.* | awk -v f="$f" '$1 == f { print $2 }' | stat)
  b=$(cat "$tmp"/off.* | awk -v f="$f" '$1 == f { print $2 }' | stat)
  echo "$f $a $b" | awk '{ printf "%-28s %10.2f %10.2f %7.3f %10.2f %10.2f %7.3f\n", $1, $2, $4, ($4 > 0) ? $2 / $4 : 0, $3, $5, ($5 > 0) ? $3 / $5 : 0 }'
done
