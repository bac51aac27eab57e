#!/bin/sh
# The README's quick start is a complete program: extract it (the ```c block between the
# "quickstart.c begin" and "quickstart.c end" markers), compile it with -std=c99 -Wall -Wextra
# -Werror -pedantic under gcc and clang, run it, and check that it prints what the README says
# (tests/doc_program.sh).
# usage: sh tests/readme_quickstart.sh [BUILD_DIR]      ends "N passed, N failed"
#        sh tests/readme_quickstart.sh --extract FILE  only writes the program to FILE
T=readme_quickstart
. tests/doc_program.sh
if [ "$1" = --extract ]; then
  doc_extract README.md quickstart "$2" || { echo "$T: no program between the markers in README.md"; exit 1; }
  exit 0
fi
dir=${1:-build}/quickstart
mkdir -p "$dir" || exit 1
if doc_extract README.md quickstart "$dir/quickstart.c"; then ok; else bad "no program between the quickstart.c markers in README.md"; fi
# the line the README quotes as the program's output
said=$(sed -n 's/^It prints `\(quickstart: [^`]*\)`.*/\1/p' README.md)
[ -n "$said" ] && ok || bad "the README does not quote the program's output (It prints \`quickstart: ...\`)"
doc_run "$dir/quickstart.c" "$said" 0
doc_done
