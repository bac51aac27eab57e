#!/bin/sh
# docs/training.md's trainer is a complete program: extract it (the ```c block between the
# "trainer.c begin" and "trainer.c end" markers), compile it with -std=c99 -Wall -Wextra -Werror
# -pedantic under gcc and clang, run it (its resumed run must equal the uninterrupted one bit for
# bit), and check that its last line is the one the page quotes (tests/doc_program.sh). Negative
# control: the same program with the momentum left out of the checkpoint must report a different
# resumed run.
# usage: sh tests/training_trainer.sh [BUILD_DIR]      ends "N passed, N failed"
#        sh tests/training_trainer.sh --extract FILE  only writes the program to FILE
T=training_trainer
DOC=docs/training.md
. tests/doc_program.sh
if [ "$1" = --extract ]; then
  doc_extract $DOC trainer "$2" || { echo "$T: no program between the markers in $DOC"; exit 1; }
  exit 0
fi
dir=${1:-build}/training
mkdir -p "$dir" || exit 1
if doc_extract $DOC trainer "$dir/trainer.c"; then ok; else bad "no program between the trainer.c markers in $DOC"; fi
said=$(sed -n 's/^It ends `\(trainer: [^`]*\)`.*/\1/p' $DOC)
[ -n "$said" ] && ok || bad "$DOC does not quote the program's last line (It ends \`trainer: ...\`)"
doc_run "$dir/trainer.c" "$said" 1
# the control: without the momentum in the checkpoint the resumed run must differ, and say so
sed 's/\.n_state = 1, \.state = (const void\*\[\]){&t->M}, //' "$dir/trainer.c" > "$dir/trainer-ctl.c"
if cmp -s "$dir/trainer.c" "$dir/trainer-ctl.c"; then
  bad "control: the checkpoint's state line was not found to take out"
elif ${CC:-cc} -std=c99 -I"$(pwd)" "$dir/trainer-ctl.c" -o "$dir/trainer-ctl" -lpthread -lm; then
  if out=$(cd "$dir" && ./trainer-ctl); then bad "control: the trainer resumed without its momentum passes: $(echo "$out" | tail -n 1)"
  else echo "$out" | tail -n 1 | grep -q 'DIFFERENT$' && ok || bad "control: failed for another reason: $out"; fi
else bad "control: does not compile"; fi
doc_done
