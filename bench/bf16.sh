#!/bin/sh
# bf16 activations against f32 in the CPU GPT (examples/gpt_cpu.c --dtype): the same run with
# --dtype f32 and --dtype bf16, one after the other RUNS times each (f32, bf16, f32, ...). Prints
# the bytes the stages sent (pp_step_stats: tensors, without metadata and the step agreement),
# tokens/s (the best run: on a shared machine the least disturbed), the loss at the start and the
# end, the largest per-step loss difference, and the bf16 / f32 ratios. The footer says OK when
# bf16 sent exactly half the tensor bytes in as many messages, else FAILED (exit 1).
#   make bench-bf16                                    (1 run each, 200 steps, the default corpus)
#   sh bench/bf16.sh RUNS [gpt_cpu args]               (build/gpt_cpu, or GPT_CPU=...; KEEP=PATH
#                                                      keeps the first runs' output in PATH.f32, PATH.bf16)
runs=${1:-1}
[ $# -gt 0 ] && shift
bin=${GPT_CPU:-${B:-build}/gpt_cpu}
tmp=${TMPDIR:-/tmp}/pp-bf16-bench.$$
mkdir -p "$tmp" || exit 1
trap 'rm -rf "$tmp"' EXIT
i=0
while [ $i -lt "$runs" ]; do
  for dt in f32 bf16; do
    "$bin" "$@" --dtype $dt > "$tmp/$dt.$i" 2>&1 || { echo "bf16.sh: $bin $* --dtype $dt failed"; cat "$tmp/$dt.$i"; exit 1; }
  done
  i=$((i + 1))
done
# one run's figures as "name value" lines
figures() {
  awk '/^sent in/ { for (k = 1; k <= NF; k++) { if ($k == "steps:") steps = $(k - 1); if ($k == "bytes" && $(k + 1) == "in") b[++nb] = $(k - 1);
                                                if ($k == "messages;" || $k == "messages,") m[++nm] = $(k - 1) }
                    print "tensor_bytes_all_steps", b[2]; print "tensor_bytes_per_step", b[2] / steps; print "tensor_msgs_per_step", m[2] / steps
                    print "tensor_bytes_per_transfer", b[2] / m[2]; print "all_bytes_per_step", b[1] / steps }
       /^loss .* -> / { print "loss_first5", $2; print "loss_last5", $4 }
       /tokens in .* tokens\/s/ { for (k = 1; k <= NF; k++) if ($k == "tokens/s;") print "tokens_per_s", $(k - 1) }' "$1"
}
best() { # best (largest) tokens/s of a dtype's runs, or the first run's value of another figure
  for f in "$tmp/$1".*; do figures "$f"; done | awk -v n="$2" '$1 == n { if (n == "tokens_per_s") { if ($2 > v) v = $2 } else if (!seen++) v = $2 }
                                                               END { print v }'
}
echo "# gpt_cpu $* : --dtype f32 vs bf16, $runs run(s) each, alternating ($(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg))"
printf '%-34s %14s %14s %9s\n' figure f32 bf16 bf16/f32
for n in tensor_bytes_per_transfer tensor_bytes_per_step tensor_msgs_per_step all_bytes_per_step tokens_per_s loss_first5 loss_last5; do
  a=$(best f32 $n); b=$(best bf16 $n)
  awk -v n="$n" -v a="$a" -v b="$b" 'BEGIN { printf "%-34s %14.6g %14.6g %9.4f\n", n, a, b, a != 0 ? b / a : 0 }'
done
grep '^step' "$tmp/f32.0" | awk '{ print $4 }' > "$tmp/lf"
grep '^step' "$tmp/bf16.0" | awk '{ print $4 }' > "$tmp/lb"
d=$(paste -d' ' "$tmp/lf" "$tmp/lb" | awk '{ d = $2 - $1; if (d < 0) d = -d; if (d > mx) { mx = d; at = NR - 1 }
                                                if (d > 0.05 && !apart) apart = NR }
                                          END { printf "%.4f at step %d; ", mx, at
                                                if (apart) printf "first above 0.05 at step %d (f32 %s, bf16 %s)", apart - 1, f[apart], b[apart]
                                                else printf "none above 0.05" }
                                          { f[NR] = $1; b[NR] = $2 }')
echo "largest |loss difference| of a step: $d"
[ -n "$KEEP" ] && cp "$tmp/f32.0" "$KEEP.f32" && cp "$tmp/bf16.0" "$KEEP.bf16"
fb=$(best f32 tensor_bytes_all_steps); bb=$(best bf16 tensor_bytes_all_steps)
fm=$(best f32 tensor_msgs_per_step); bm=$(best bf16 tensor_msgs_per_step)
if awk -v a="$fb" -v b="$bb" -v x="$fm" -v y="$bm" 'BEGIN { exit !(a > 0 && 2 * b == a && x == y) }'; then
  echo "OK: bf16 sends half the tensor bytes in as many messages"
else
  echo "FAILED: bf16 tensor bytes $bb, f32 $fb; messages per step $bm, $fm"
  exit 1
fi
