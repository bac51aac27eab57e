# tests/doc_program.sh - what tests/readme_quickstart.sh and tests/training_trainer.sh share (sourced,
# not run): a complete program in a page of the docs, the ```c block between the "NAME.c begin"
# and "NAME.c end" markers, extracted, compiled with -std=c99 -Wall -Wextra -Werror -pedantic under
# gcc and clang, run, and its output compared with the line the page quotes.
# The caller sets T (its name in messages) and counts with ok / bad.
pass=0; fail=0
ok() { pass=$((pass + 1)); }
bad() { echo "$T: FAILED, $1"; fail=$((fail + 1)); }
# doc_extract PAGE NAME OUT: the program between NAME's markers in PAGE into OUT; fails without main
doc_extract() {
  awk -v b="<!-- $2.c begin" -v e="<!-- $2.c end" 'index($0, b) == 1 { on = 1; next } index($0, e) == 1 { on = 0 } on && !/^```/' "$1" > "$3"
  grep -q '^int main' "$3"
}
# doc_run SRC WANT LAST: build SRC with each compiler, run it in SRC's folder, compare its output
# (LAST = 1: its last line) with WANT
doc_run() {
  d=$(dirname "$1"); root=$(pwd)
  for cc in ${CC:-cc} ${CLANG:-clang}; do
    command -v "$cc" >/dev/null 2>&1 || { echo "$T: $cc not found, skipped"; continue; }
    exe=$(basename "$1" .c)-$cc
    if ! $cc -std=c99 -Wall -Wextra -Werror -pedantic -I"$root" "$1" -o "$d/$exe" -lpthread -lm; then
      bad "the program does not compile with $cc"; continue
    fi
    ok
    if out=$(cd "$d" && "./$exe"); then ok; else bad "the program ($cc) exits non-zero: $out"; continue; fi
    [ "$3" = 1 ] && out=$(echo "$out" | tail -n 1)
    echo "$cc: $out"
    [ "$out" = "$2" ] && ok || bad "it printed \"$out\", the page says \"$2\""
  done
}
doc_done() {
  echo "$T: $pass passed, $fail failed"
  [ $fail -eq 0 ]
}
