#!/bin/sh
# Negative controls: each command is a test built against a deliberately broken library and must
# fail (exit code not 0). Prints "NAME: N passed, N failed" (a passing control is a failure).
# CONTROLS_JOBS=N runs them N at a time (command i in runner i % N, each runner in order): for
# controls that mostly wait on deadlines and hangs, not on a core.
name=$1; shift
jobs=${CONTROLS_JOBS:-1}
dir=$(mktemp -d "${TMPDIR:-/tmp}/controls.XXXXXX") || exit 1
j=0
while [ "$j" -lt "$jobs" ]; do
  (
    i=0
    for cmd in "$@"; do
      if [ $((i % jobs)) -eq "$j" ]; then
        if timeout 300 $cmd > /dev/null 2>&1; then echo "FAIL control passed (it must fail): $cmd" >> "$dir/fail.$j"
        else echo ok >> "$dir/pass.$j"; fi
      fi
      i=$((i + 1))
    done
  ) &
  j=$((j + 1))
done
wait
pass=$(cat "$dir"/pass.* 2>/dev/null | wc -l)
fail=$(cat "$dir"/fail.* 2>/dev/null | wc -l)
cat "$dir"/fail.* 2>/dev/null
rm -rf "$dir"
pass=$((pass + 0)); fail=$((fail + 0))
echo "$name: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
