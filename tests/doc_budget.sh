#!/bin/sh
# The docs stay readable in one sitting: README.md at most 400 lines, README.md and docs/*.md
# together at most 3000; and every relative link in them resolves (the file, and the #anchor
# to a heading of it, as GitHub makes anchors). Prints the counts; exits 1 naming what is wrong.
# usage: sh tests/doc_budget.sh   (DOC_README=FILE checks FILE in place of README.md: the control)
readme=${DOC_README:-README.md}
max_readme=400
max_total=3000
bad=0
n_readme=$(wc -l < "$readme")
n_docs=$(cat docs/*.md | wc -l)
total=$((n_readme + n_docs))
echo "doc-budget: README.md $n_readme lines (at most $max_readme), README.md + docs/*.md $total (at most $max_total)"
for f in docs/*.md; do printf '  %-22s %5d\n' "$f" "$(wc -l < "$f")"; done
[ "$n_readme" -le $max_readme ] || { echo "doc-budget: README.md is $n_readme lines, over $max_readme"; bad=1; }
[ "$total" -le $max_total ] || { echo "doc-budget: README.md + docs/*.md is $total lines, over $max_total"; bad=1; }

# anchors of a markdown file: its headings, lower case, punctuation out, spaces to hyphens
anchors() {
  awk '/^```/{code = !code} !code && /^#+ /' "$1" | sed 's/^#* *//' | tr 'A-Z' 'a-z' |
    sed 's/[^a-z0-9 _-]//g; s/ /-/g'
}
nl=0
for f in "$readme" docs/*.md; do
  name=$f; [ "$f" = "$readme" ] && name=README.md
  dir=$(dirname "$name")
  for link in $(awk '/^```/{code = !code} !code' "$f" | grep -oE '\]\([^) ]+\)' | sed 's/^](//; s/)$//'); do
    case $link in http://*|https://*|mailto:*) continue ;; esac
    nl=$((nl + 1))
    path=${link%%#*}; frag=
    case $link in *'#'*) frag=${link#*#} ;; esac
    if [ -z "$path" ]; then target=$f; else target=$dir/$path; [ "$dir" = . ] && target=$path; fi
    [ -z "$path" ] || [ -e "$target" ] || { echo "doc-budget: $name links to $link: no file $target"; bad=1; continue; }
    [ "$target" = README.md ] && target=$readme
    if [ -n "$frag" ] && ! anchors "$target" | grep -qxF "$frag"; then
      echo "doc-budget: $name links to $link: no heading with that anchor in $target"; bad=1
    fi
  done
done
[ $bad -eq 0 ] || exit 1
echo "doc-budget: within budget; all $nl relative links resolve"
