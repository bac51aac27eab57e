#!/bin/sh
# Negative controls: each command is a test built against a deliberately broken library and must
# fail (exit code not 0). Prints "NAME: N passed, N failed" (a passing control is a failure).
name=$1; shift
pass=0; fail=0
for cmd in "$@"; do
  if timeout 300 $cmd > /dev/null 2>&1; then echo "FAIL control passed (it must fail): $cmd"; fail=$((fail + 1))
  else pass=$((pass + 1)); fi
done
echo "$name: $pass passed, $fail failed"
[ $fail -eq 0 ]
