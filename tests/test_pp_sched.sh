#!/bin/sh
# tests/test_pp_sched.sh PP_SCHED - the pp-sched command line: a table written and loaded back,
# and the messages of bad input. Prints "pp-sched-cli: N passed, N failed".
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
rm -f "$tmp.out" "$tmp.tab" "$tmp.bad"
echo "pp-sched-cli: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
