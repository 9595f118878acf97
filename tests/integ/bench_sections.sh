#!/usr/bin/env bash
# make bench's sections as bench/run prints them and bench/README.md's, held to each other:
# each heading bench/run prints (section 4's from bench/allreduce.sh, numbered by bench/run)
# has the README's number and starts with its title; the README's sections are numbered 1, 2,
# 3... in order, and bench/run prints them in that order; the only README section bench/run
# leaves out is one that says it is "Not part of `make bench`" (section 7, the GPU step).
# timeout: 20
set -euo pipefail

# shellcheck source=prologue.sh
. "$(dirname "$0")/prologue.sh"
fail_show=(readme run)

# "N<TAB>title" per numbered section of the README, and the README sections that are not
# part of make bench.
awk '/^## [0-9]+\. / { n = $2; sub(/\.$/, "", n); t = $0; sub(/^## [0-9]+\. /, "", t)
                       print n "\t" t; cur = n; next }
     /^## / { cur = "" }
     cur != "" && /Not part of `make bench`/ { print cur >"'"$work/gpu_only"'" }' \
    "$root/bench/README.md" >"$work/readme"
touch "$work/gpu_only"

# The same of bench/run: its echoed headings, and the heading of bench/allreduce.sh under the
# number bench/run's sed gives it.
allreduce=$(sed -n 's/^echo "## \([^"$]*\).*/\1/p' "$root/bench/allreduce.sh" | head -n 1)
[ -n "$allreduce" ] || fail "bench/allreduce.sh prints no '## ' heading"
sed -n -e 's/^echo "## \([0-9][0-9]*\)\. \(.*\)"$/\1\t\2/p' \
    -e "s|^sed '0,/^## /s/^## /## \\([0-9][0-9]*\\)\\. /'.*|\\1\\t$allreduce|p" \
    "$root/bench/run" >"$work/run"

[ -s "$work/run" ] || fail "no section headings found in bench/run"
want=1
while IFS=$'\t' read -r n _; do
    [ "$n" = "$want" ] || fail "bench/README.md: section $n where section $want was due"
    want=$((want + 1))
done <"$work/readme"

prev=0
while IFS=$'\t' read -r n title; do
    [ "$n" -gt "$prev" ] || fail "bench/run prints section $n after section $prev"
    prev=$n
    rt=$(awk -F '\t' -v n="$n" '$1 == n { print $2 }' "$work/readme")
    [ -n "$rt" ] || fail "bench/run prints section $n ('$title'), which bench/README.md lacks"
    [[ $title == "$rt"* ]] ||
        fail "section $n: bench/run prints '$title', bench/README.md has '$rt'"
done <"$work/run"

while IFS=$'\t' read -r n title; do
    grep -q "^$n"$'\t' "$work/run" || grep -qx "$n" "$work/gpu_only" ||
        fail "bench/README.md's section $n ('$title') is not printed by bench/run"
done <"$work/readme"
echo "# $(wc -l <"$work/run") sections of bench/run in bench/README.md's order;" \
    "README only: $(tr '\n' ' ' <"$work/gpu_only")"
