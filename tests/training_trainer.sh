#!/bin/sh
# docs/training.md's trainer is a complete program: extract it (the ```c block between the
# "trainer.c begin" and "trainer.c end" markers), compile it with -std=c99 -Wall -Wextra -Werror
# -pedantic under gcc and clang, run it (its resumed run must equal the uninterrupted one bit for
# bit), and check that its last line is the one the page quotes. Negative control: the same
# program with the momentum left out of the checkpoint must report a different resumed run.
# usage: sh tests/training_trainer.sh [BUILD_DIR]      ends "N passed, N failed"
#        sh tests/training_trainer.sh --extract FILE  only writes the program to FILE
DOC=docs/training.md
extract() {
  awk '/<!-- trainer.c begin/ { on = 1; next } /<!-- trainer.c end/ { on = 0 } on && !/^```/' $DOC > "$1"
  grep -q '^int main' "$1"
}
if [ "$1" = --extract ]; then
  extract "$2" || { echo "training_trainer: no program between the markers in $DOC"; exit 1; }
  exit 0
fi
B=${1:-build}
dir=$B/training
mkdir -p "$dir" || exit 1
pass=0; fail=0
ok() { pass=$((pass + 1)); }
bad() { echo "training_trainer: FAILED, $1"; fail=$((fail + 1)); }
if extract "$dir/trainer.c"; then ok; else bad "no program between the trainer.c markers in $DOC"; fi
said=$(sed -n 's/^It ends `\(trainer: [^`]*\)`.*/\1/p' $DOC)
[ -n "$said" ] && ok || bad "$DOC does not quote the program's last line (It ends \`trainer: ...\`)"
root=$(pwd)
for cc in ${CC:-cc} ${CLANG:-clang}; do
  command -v "$cc" >/dev/null 2>&1 || { echo "training_trainer: $cc not found, skipped"; continue; }
  if ! $cc -std=c99 -Wall -Wextra -Werror -pedantic -I"$root" "$dir/trainer.c" -o "$dir/trainer-$cc" -lpthread -lm; then
    bad "the trainer does not compile with $cc"; continue
  fi
  ok
  if out=$(cd "$dir" && "./trainer-$cc"); then ok; else bad "the trainer ($cc) exits non-zero: $out"; continue; fi
  last=$(echo "$out" | tail -n 1)
  echo "$cc: $last"
  [ "$last" = "$said" ] && ok || bad "it ended \"$last\", $DOC says \"$said\""
done
# the control: without the momentum in the checkpoint the resumed run must differ, and say so
sed 's/\.n_state = 1, \.state = (const void\*\[\]){&t->M}, //' "$dir/trainer.c" > "$dir/trainer-ctl.c"
if cmp -s "$dir/trainer.c" "$dir/trainer-ctl.c"; then
  bad "control: the checkpoint's state line was not found to take out"
elif ${CC:-cc} -std=c99 -I"$root" "$dir/trainer-ctl.c" -o "$dir/trainer-ctl" -lpthread -lm; then
  if out=$(cd "$dir" && ./trainer-ctl); then bad "control: the trainer resumed without its momentum passes: $(echo "$out" | tail -n 1)"
  else echo "$out" | tail -n 1 | grep -q 'DIFFERENT$' && ok || bad "control: failed for another reason: $out"; fi
else bad "control: does not compile"; fi
echo "training_trainer: $pass passed, $fail failed"
[ $fail -eq 0 ]
