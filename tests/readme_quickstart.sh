#!/bin/sh
# The README's quick start is a complete program: extract it (the ```c block between the
# "quickstart.c begin" and "quickstart.c end" markers), compile it with -std=c99 -Wall -Wextra
# -Werror -pedantic under gcc and clang, run it, and check that it prints what the README says.
# usage: sh tests/readme_quickstart.sh [BUILD_DIR]      ends "N passed, N failed"
#        sh tests/readme_quickstart.sh --extract FILE  only writes the program to FILE
extract() {
  awk '/<!-- quickstart.c begin/ { on = 1; next } /<!-- quickstart.c end/ { on = 0 } on && !/^```/' README.md > "$1"
  grep -q '^int main' "$1"
}
if [ "$1" = --extract ]; then
  extract "$2" || { echo "readme_quickstart: no program between the markers in README.md"; exit 1; }
  exit 0
fi
B=${1:-build}
dir=$B/quickstart
mkdir -p "$dir" || exit 1
pass=0; fail=0
ok() { pass=$((pass + 1)); }
bad() { echo "readme_quickstart: FAILED, $1"; fail=$((fail + 1)); }
if extract "$dir/quickstart.c"; then ok; else bad "no program between the quickstart.c markers in README.md"; fi
# the line the README quotes as the program's output
said=$(sed -n 's/^It prints `\(quickstart: [^`]*\)`.*/\1/p' README.md)
[ -n "$said" ] && ok || bad "the README does not quote the program's output (It prints \`quickstart: ...\`)"
for cc in ${CC:-cc} ${CLANG:-clang}; do
  command -v "$cc" >/dev/null 2>&1 || { echo "readme_quickstart: $cc not found, skipped"; continue; }
  if ! $cc -std=c99 -Wall -Wextra -Werror -pedantic -I. "$dir/quickstart.c" -o "$dir/quickstart-$cc" -lpthread -lm; then
    bad "the quick start does not compile with $cc"; continue
  fi
  ok
  if out=$("$dir/quickstart-$cc"); then ok; else bad "the quick start ($cc) exits non-zero: $out"; continue; fi
  echo "$cc: $out"
  [ "$out" = "$said" ] && ok || bad "it printed \"$out\", the README says \"$said\""
done
echo "readme_quickstart: $pass passed, $fail failed"
[ $fail -eq 0 ]
