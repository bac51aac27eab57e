#!/bin/sh
# Runs each test binary (valgrind:PATH runs PATH under memcheck), echoes its output, and sums the "N passed, N failed" closing lines.
# TSan needs a fixed address layout on kernels with high ASLR entropy: setarch -R gives it.
# PP_TEST_JOBS=N runs up to N binaries at once (make quick: 2; many tests mostly wait on
# deadlines); the output keeps the order of the arguments either way.
jobs=${PP_TEST_JOBS:-1}
dir=$(mktemp -d "${TMPDIR:-/tmp}/pp-run.XXXXXX") || exit 1
trap 'rm -rf "$dir"' EXIT
trap 'exit 130' INT TERM

# run_one T: what the runner prints for T, then a last line "@ PASSED FAILED STATUS".
run_one() {
  t=$1
  case "$t" in
    */tsan-*) if setarch "$(uname -m)" -R true 2>/dev/null; then run="setarch $(uname -m) -R"; else run=""; fi ;;
    valgrind:*)
      t="${t#valgrind:}"
      if ! command -v "${VALGRIND:-valgrind}" >/dev/null 2>&1; then echo "valgrind $t: valgrind not found, skipped"; echo "@ 0 0 0 0"; return; fi
      run="${VALGRIND:-valgrind} -q --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite" ;;
    *) run="" ;;
  esac
  t0=$(date +%s%N)
  out=$($run "$t" 2>&1); rc=$?
  ms=$((($(date +%s%N) - t0) / 1000000))
  line=$(printf '%s\n' "$out" | grep -E '[0-9]+ passed, [0-9]+ failed' | tail -1)
  p=$(printf '%s\n' "$line" | sed -E 's/.* ([0-9]+) passed, ([0-9]+) failed.*/\1/')
  f=$(printf '%s\n' "$line" | sed -E 's/.* ([0-9]+) passed, ([0-9]+) failed.*/\2/')
  [ -n "$p" ] || p=0
  [ -n "$f" ] || f=0
  st=0
  if [ $rc -ne 0 ] || [ -z "$line" ]; then
    printf '%s\n' "$out" | tail -40
    echo "$t: exit code $rc"
    [ "$f" -eq 0 ] && f=1
    st=1
  fi
  echo "$t: $p passed, $f failed"
  echo "@ $p $f $st $ms"
}

# a worker claims the next unclaimed argument (mkdir is atomic) until none is left
worker() {
  i=0
  for t in "$@"; do
    i=$((i + 1))
    mkdir "$dir/claim.$i" 2>/dev/null || continue
    run_one "$t" > "$dir/out.$i"
    mv "$dir/out.$i" "$dir/done.$i"
  done
}

w=0
while [ $w -lt "$jobs" ]; do
  worker "$@" &
  w=$((w + 1))
done

pass=0; fail=0; status=0; i=0
for t in "$@"; do
  i=$((i + 1))
  while [ ! -f "$dir/done.$i" ]; do sleep 0.05; done
  grep -v '^@ ' "$dir/done.$i"
  read -r _ p f st ms <<EOF
$(grep '^@ ' "$dir/done.$i" | tail -1)
EOF
  printf '%s %s\n' "$ms" "$t" >> "$dir/times"
  pass=$((pass + p)); fail=$((fail + f))
  [ "$st" -eq 0 ] || status=1
done
wait
# the ten slowest, with their seconds (a test over 60 s says why in its comment); PP_TEST_TIMES=FILE
# keeps every test's (milliseconds, slowest first)
[ -n "${PP_TEST_TIMES:-}" ] && sort -rn "$dir/times" > "$PP_TEST_TIMES"
if [ "$#" -gt 1 ]; then
  echo "slowest:"
  sort -rn "$dir/times" | head -10 | awk '{ printf "  %7.1f s  %s\n", $1 / 1000, $2 }'
fi
echo "total: $pass passed, $fail failed"
exit $status
