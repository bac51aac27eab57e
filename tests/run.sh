#!/bin/sh
# Runs each test binary (valgrind:PATH runs PATH under memcheck), echoes its output, and sums the "N passed, N failed" closing lines.
# TSan needs a fixed address layout on kernels with high ASLR entropy: setarch -R gives it.
pass=0; fail=0; status=0
for t in "$@"; do
  case "$t" in
    */tsan-*) if setarch "$(uname -m)" -R true 2>/dev/null; then run="setarch $(uname -m) -R"; else run=""; fi ;;
    valgrind:*)
      t="${t#valgrind:}"
      if ! command -v "${VALGRIND:-valgrind}" >/dev/null 2>&1; then echo "valgrind $t: valgrind not found, skipped"; continue; fi
      run="${VALGRIND:-valgrind} -q --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite" ;;
    *) run="" ;;
  esac
  out=$($run "$t" 2>&1); rc=$?
  line=$(printf '%s\n' "$out" | grep -E '[0-9]+ passed, [0-9]+ failed' | tail -1)
  p=$(printf '%s\n' "$line" | sed -E 's/.* ([0-9]+) passed, ([0-9]+) failed.*/\1/')
  f=$(printf '%s\n' "$line" | sed -E 's/.* ([0-9]+) passed, ([0-9]+) failed.*/\2/')
  [ -n "$p" ] || p=0
  [ -n "$f" ] || f=0
  if [ $rc -ne 0 ] || [ -z "$line" ]; then
    printf '%s\n' "$out" | tail -40
    echo "$t: exit code $rc"
    [ "$f" -eq 0 ] && f=1
    status=1
  fi
  echo "$t: $p passed, $f failed"
  pass=$((pass + p)); fail=$((fail + f))
done
echo "total: $pass passed, $fail failed"
exit $status
