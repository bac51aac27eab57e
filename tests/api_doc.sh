#!/bin/sh
# docs/api.md names every public name the headers declare, each as `name`:
#   functions (pp_x), types (pp_x), struct fields (`pp_struct.field`, one line each), macros
#   (#define PP_X, and the PP_ configuration macros the headers test with #if/#ifdef, test hooks
#   PP_*TEST_* aside) and enum values (PP_X, including PP_RESULT_LIST's results).
# usage: sh tests/api_doc.sh [DOC]  (default docs/api.md); exits 1 naming each missing name.
doc=${1:-docs/api.md}
[ -r "$doc" ] || { echo "api-doc: cannot read $doc"; exit 1; }
hdrs="pipeline.h pipeline_cuda.h pipeline_nccl.h pipeline_mpi.h"
# the declarations: each header up to its implementation
decl=$(for h in $hdrs; do
  awk '/^\/\* >>impl|^#ifdef PIPELINE_IMPLEMENTATION|^#if defined\(PIPELINE_IMPLEMENTATION\) && !defined\(PIPELINE_[A-Z]+_IMPLEMENTATION_DONE/{exit} {print}' "$h"
done)
fns=$(printf '%s\n' "$decl" | grep -oE '\bpp_[a-z0-9_]+\(' | tr -d '(' | sort -u)
types=$(printf '%s\n' "$decl" | grep -oE '^typedef (struct|enum)? ?[a-z_0-9 ]*\bpp_[a-z0-9_]+|\} pp_[a-z0-9_]+;|\(\*pp_[a-z_]+\)' |
  grep -oE 'pp_[a-z0-9_]+' | sort -u)
# struct fields: the depth-1 declarations of every `struct pp_x {` (comments out, statements
# joined up to their ';'; `int a, b[4];` gives a and b, `int (*f)(...)` gives f)
fields=$(printf '%s\n' "$decl" | awk '
  function stmt(s,   n, parts, k, p, id) {
    gsub(/\[[^]]*\]/, "", s)
    if (match(s, /\( *\* *[A-Za-z_0-9]+ *\)/)) { id = substr(s, RSTART, RLENGTH); gsub(/[()* ]/, "", id); print name "." id; return }
    gsub(/\([^)]*\)/, "", s)
    n = split(s, parts, ",")
    for (k = 1; k <= n; k++) {
      p = parts[k]; sub(/ *=.*$/, "", p); sub(/ *: *[0-9]+ *$/, "", p); sub(/[ \t]+$/, "", p)
      if (match(p, /[A-Za-z_][A-Za-z_0-9]*$/)) { id = substr(p, RSTART, RLENGTH); if (id != "NESTED") print name "." id }
    }
  }
  {
    line = $0
    if (incomment) { if (line ~ /\*\//) { sub(/^.*\*\//, "", line); incomment = 0 } else next }
    gsub(/\/\*([^*]|\*+[^*\/])*\*+\//, "", line)
    if (line ~ /\/\*/) { sub(/\/\*.*$/, "", line); incomment = 1 }
    sub(/\/\/.*$/, "", line)
    if (depth == 0) {
      if (!match(line, /^(typedef )?struct pp_[a-z0-9_]+ *\{/)) next
      name = substr(line, RSTART, RLENGTH); sub(/^(typedef )?struct /, "", name); sub(/ *\{$/, "", name)
      depth = 1; buf = ""; line = substr(line, RSTART + RLENGTH)
    }
    for (i = 1; i <= length(line); i++) {
      c = substr(line, i, 1)
      if (c == "{") { depth++; continue }
      if (c == "}") { depth--; if (depth == 0) break; if (depth == 1) buf = buf " NESTED "; continue }
      if (depth == 1) { if (c == ";") { stmt(buf); buf = "" } else buf = buf c }
    }
    if (depth >= 1) buf = buf " "
  }' | sort -u)
macros=$( { printf '%s\n' "$decl" | grep -oE '^#define PP_[A-Z0-9_]+' | cut -d' ' -f2
  cat $hdrs | grep -E '^[ \t]*#[ \t]*(ifn?def|if|elif)' | grep -oE '\bPP_[A-Z0-9_]+' | grep -v '_TEST_'; } | sort -u)
enums=$( { printf '%s\n' "$decl" | awk '/^typedef enum|^enum/{on=1} on{print} on && /\}/{on=0}' | grep -oE '\bPP_[A-Z0-9_]+'
  printf '%s\n' "$decl" | grep -oE '^ *X\(PP_[A-Z0-9_]+' | grep -oE 'PP_[A-Z0-9_]+'; } | sort -u)
missing=0; n=0; nf=0; nt=0; nfield=0; nm=0; ne=0
check() { # name kind
  n=$((n + 1))
  grep -qF "\`$1" "$doc" && grep -qE "\`$1(\`|\()" "$doc" ||
    { echo "api-doc: $2 $1 is public but not in $doc"; missing=$((missing + 1)); }
}
for x in $fns; do nf=$((nf + 1)); check "$x" function; done
for x in $types; do nt=$((nt + 1)); check "$x" type; done
for x in $fields; do nfield=$((nfield + 1)); check "$x" field; done
for x in $macros; do nm=$((nm + 1)); check "$x" macro; done
for x in $enums; do ne=$((ne + 1)); check "$x" "enum value"; done
[ "$nf" -gt 100 ] && [ "$nfield" -gt 200 ] && [ "$ne" -gt 40 ] ||
  { echo "api-doc: found only $nf functions, $nfield fields, $ne enum values in the headers"; exit 1; }
if [ $missing -ne 0 ]; then echo "api-doc: $missing of $n public names missing from $doc"; exit 1; fi
echo "api-doc: $doc names all $n public names: $nf functions, $nt types, $nfield struct fields, $nm macros, $ne enum values"
