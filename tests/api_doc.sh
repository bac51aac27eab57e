#!/bin/sh
# Every public function and type the headers declare is named in docs/api.md (as `name`).
# usage: sh tests/api_doc.sh [DOC]  (default docs/api.md); exits 1 naming what is missing.
doc=${1:-docs/api.md}
decl=$(for h in pipeline.h pipeline_cuda.h pipeline_nccl.h pipeline_mpi.h; do
  awk '/^\/\* >>impl|^#ifdef PIPELINE_IMPLEMENTATION/{exit} {print}' "$h"; done)
fns=$(printf '%s\n' "$decl" | grep -oE '\bpp_[a-z0-9_]+\(' | tr -d '(' | sort -u)
types=$(printf '%s\n' "$decl" | grep -oE '^typedef (struct|enum)? ?[a-z_0-9 ]*\bpp_[a-z0-9_]+|\} pp_[a-z0-9_]+;|\(\*pp_[a-z_]+\)' |
  grep -oE 'pp_[a-z0-9_]+' | sort -u)
missing=0; n=0
for name in $fns $types; do
  n=$((n + 1))
  grep -qE "\`$name(\`|\()" "$doc" || { echo "api-doc: $name is public but not in $doc"; missing=$((missing + 1)); }
done
[ "$n" -gt 100 ] || { echo "api-doc: found only $n public names in the headers"; exit 1; }
[ $missing -eq 0 ] || exit 1
echo "api-doc: $doc names all $n public functions and types"
