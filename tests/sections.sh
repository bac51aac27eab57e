#!/bin/sh
# pipeline.h's SECTIONS map names every ">>name" marker of the file, in file order, and nothing else.
# usage: sh tests/sections.sh [FILE]  (default pipeline.h); exits 1 showing both lists.
f=${1:-pipeline.h}
markers=$(grep -oE '^/\* >>[a-z-]+' "$f" | sed 's|^/\* ||' | tr '\n' ' ')
map=$(awk '/^   SECTIONS/{on=1} on && /^   [A-Z]/ && !/SECTIONS/{exit} on{print}' "$f" | grep -oE '>>[a-z-]+' |
  grep -v '^>>name$' | tr '\n' ' ')
[ -n "$markers" ] || { echo "sections: no marker in $f"; exit 1; }
if [ "$markers" != "$map" ]; then
  echo "sections: $f's SECTIONS map differs from its markers"
  echo "  map:     $map"
  echo "  markers: $markers"
  exit 1
fi
echo "sections: $f's map names its $(echo $markers | wc -w) markers in order"
