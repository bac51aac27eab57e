#!/bin/sh
# tests/test_pp_sched.sh PP_SCHED - the pp-sched command line: a table written and loaded back,
# the forward-only list (--eval), and the messages of bad input. Prints "pp-sched-cli: N passed,
# N failed".
bin=${1:-build/pp-sched}
tmp=${TMPDIR:-/tmp}/pp-sched-test.$$
pass=0; fail=0
check() { # check WHAT COND
    if eval "$2"; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL $1"; fi
}
"$bin" 1f1b -p 2 -m 3 --table > "$tmp.out" 2>&1
grep -v '^#' "$tmp.out" > "$tmp.tab"
check "1f1b table written" "grep -q '^r1: F0.0 B0.0' '$tmp.tab'"
"$bin" load "$tmp.tab" > "$tmp.out" 2>&1
check "the table loads back" "[ \$? -eq 0 ] && grep -q 'makespan\|bubble' '$tmp.out'"
printf 'schedule p=2 v=1 m=3 map=loop\nr0: F0.0 F1.0 X0.0\n' > "$tmp.bad"
"$bin" load "$tmp.bad" > "$tmp.out" 2>&1
rc=$?
check "a syntax error fails" "[ $rc -ne 0 ]"
check "a syntax error names its line, not memory" "grep -q 'line 2' '$tmp.out' && ! grep -q 'out of memory' '$tmp.out'"
"$bin" load "$tmp.missing" > "$tmp.out" 2>&1
check "a missing file is named" "grep -q 'cannot read' '$tmp.out'"
"$bin" nosuch -p 2 -m 3 > "$tmp.out" 2>&1
check "an unknown kind is named" "grep -q 'unknown schedule kind' '$tmp.out'"
# cost-aware generation: the example (per-stage F,B,W = 1,2,1, p=4, m=16) beats 1F1B's 76
"$bin" zb-v -p 4 -m 16 --f 0.5 --b 1 --w 0.5 > "$tmp.out" 2>&1
mk=$(sed -n 's/^makespan *//p' "$tmp.out")
check "zb-v generated for the costs beats 1f1b (makespan $mk < 76)" "awk 'BEGIN { exit !($mk < 76) }'"
for k in zb-h2 v-half v-min dualpipev; do
    "$bin" $k -p 4 -m 8 --f 1 --b 2 --w 1 > "$tmp.out" 2>&1
    check "$k runs and reports its bubble and cap" "[ \$? -eq 0 ] && grep -q 'bubble .*stash cap' '$tmp.out'"
done
"$bin" rank -p 4 -m 8 --layers 16 > "$tmp.out" 2>&1
check "rank covers every kind" "[ \$(grep -c '^ *[0-9][0-9]*  [0-9a-z]' '$tmp.out') -eq 12 ]"
"$bin" interleaved-mem -p 8 -v 4 -m 15 > "$tmp.out" 2>&1
check "interleaved-mem p=8 v=4 m=15 peaks at m=16's 39 chunks, not 60" "grep -q 'peak live  r0=38 ' '$tmp.out'"
"$bin" rank -p 4 -m 8 --layers 16 --mem-cap 12 > "$tmp.out" 2>&1
check "rank with --mem-cap answers a schedule that fits" "grep -q '^answer *v-' '$tmp.out'"
# the verdict names what stopped every kind; a finite cap (1e300) is a cap
"$bin" rank -p 4 -m 8 --layers 8 --mem-cap 1e300 > "$tmp.out" 2>&1
check "rank --mem-cap 1e300 is a cap: a plan, no 'must be finite'" "[ \$? -eq 0 ] && grep -q '^answer ' '$tmp.out' && ! grep -q 'finite' '$tmp.out'"
"$bin" rank -p 256 -m 8 --layers 8 > "$tmp.out" 2>&1
check "rank -p 256 with 8 layers: the verdict says more ranks than layers, not mem-cap" \
    "[ \$? -ne 0 ] && grep -q '^answer .*256 stages, the model has 8 layers' '$tmp.out' && ! grep -q 'mem-cap' '$tmp.out'"
"$bin" rank -p 4 -m 8 --costs 1:1:1 > "$tmp.out" 2>&1
check "rank with one layer at p = 4: the verdict says so" \
    "[ \$? -ne 0 ] && grep -q '^answer .*the model has 1 layer:' '$tmp.out' && ! grep -q 'mem-cap' '$tmp.out'"
"$bin" rank -p 4 -m 2147483647 --layers 8 > "$tmp.out" 2>&1
check "rank -m 2147483647: the verdict names the count of actions, not mem-cap" \
    "[ \$? -ne 0 ] && grep -q '^answer .*too many' '$tmp.out' && ! grep -q 'mem-cap' '$tmp.out'"
# rank --recompute: a GPT-like list (embedding, 24 blocks with 17x their output in scratch, head);
# the plan fits the cap and is no slower than the best hand choice (ratio <= 1)
gpt="0.2:0.2:0.2:1:1"; i=0
while [ $i -lt 24 ]; do gpt="$gpt,1:1:1:18:1"; i=$((i + 1)); done
gpt="$gpt,1.5:1.5:1.5:6:0"
"$bin" rank -p 4 -m 16 --costs "$gpt" --mem-cap 300 --recompute > "$tmp.out" 2>&1
rc=$?
ratio=$(sed -n 's/^answer .*: \([0-9.]*\)x the step time.*/\1/p' "$tmp.out")
check "rank --recompute plans under the cap, no slower than the hand choices (${ratio}x)" \
    "[ $rc -eq 0 ] && [ -n '$ratio' ] && awk 'BEGIN { exit !($ratio <= 1) }' && grep -q '^           recompute [0-9]* of 26 layers' '$tmp.out'"
"$bin" rank -p 4 -m 16 --costs "$gpt" --mem-cap 1 --recompute > "$tmp.out" 2>&1
check "rank --recompute under a cap nothing meets fails, saying so" "[ \$? -ne 0 ] && grep -q 'nothing fits' '$tmp.out'"
# --mem-cap alone plans recomputation too; --no-recompute gives the ranked table without it
"$bin" rank -p 4 -m 16 --costs "$gpt" --mem-cap 300 > "$tmp.out" 2>&1
check "rank --mem-cap plans recomputation by default" "[ \$? -eq 0 ] && grep -q '^plan ' '$tmp.out' && grep -q '^           recompute [0-9]* of 26 layers' '$tmp.out'"
"$bin" rank -p 4 -m 16 --costs "$gpt" --mem-cap 300 --no-recompute > "$tmp.out" 2>&1
check "rank --mem-cap --no-recompute ranks the kinds alone" "[ \$? -eq 0 ] && ! grep -q '^plan ' '$tmp.out' && grep -q '^answer *v-min (v=2): step time' '$tmp.out'"
# the forward-only list (--eval): F actions only, written with eval=1, loads back, one stash per rank
"$bin" zb-v -p 3 -m 4 --eval --table > "$tmp.out" 2>&1
grep -v '^#' "$tmp.out" > "$tmp.tab"
check "zb-v's forward-only list written" "grep -q 'eval=1' '$tmp.tab' && ! grep -q 'B' '$tmp.tab'"
"$bin" load "$tmp.tab" > "$tmp.out" 2>&1
check "the forward-only table loads back: one stash a rank, two at the turn" "[ \$? -eq 0 ] && grep -q 'peak live  r0=1 r1=1 r2=2 ' '$tmp.out'"
rm -f "$tmp.out" "$tmp.tab" "$tmp.bad"
echo "pp-sched-cli: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
