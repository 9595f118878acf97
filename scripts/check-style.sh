#!/usr/bin/env bash
# The style checks clang-format cannot make (docs/design.md, section 9, rules 13 and 14): every C file includes
# "banned.h" as its last include, and every shell script passes shellcheck. Prints each
# offence on a line of its own; exits 1 when there is one.
#
# usage: scripts/check-style.sh [banned|shellcheck]...   (default: both)
set -euo pipefail

cd "$(dirname "$0")/.."

# The project's files: tracked ones and new ones git does not ignore; outside a git checkout,
# everything but the build dir.
project_files() {
    if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
        git ls-files --cached --others --exclude-standard
    else
        find . -path ./build -prune -o -type f -print | sed 's|^\./||'
    fi
}

files=()
while IFS= read -r f; do
    [ -f "$f" ] && files+=("$f")
done < <(project_files | sort -u)

check_banned() {
    local f last bad=0
    for f in "${files[@]}"; do
        [[ $f == *.c ]] || continue
        last=$(grep -E '^[[:space:]]*#[[:space:]]*include' "$f" | tail -n 1 | tr -d '[:space:]')
        if [ -z "$last" ]; then
            echo "$f: no #include \"banned.h\""
            bad=1
        elif [ "$last" != '#include"banned.h"' ]; then
            echo "$f: the last #include is not \"banned.h\" but $last"
            bad=1
        fi
    done
    return "$bad"
}

# Shell scripts: *.sh, *.bash (sourced ones: client/completion.bash), and any other file whose
# first line runs sh or bash (tests/run, .ci/run, bench/run...).
check_shellcheck() {
    local f first scripts=()
    if ! command -v shellcheck >/dev/null; then
        echo "shellcheck is not installed (scripts/deps.sh installs it)"
        return 1
    fi
    for f in "${files[@]}"; do
        if [[ $f == *.sh || $f == *.bash ]]; then
            scripts+=("$f")
            continue
        fi
        IFS= read -r first <"$f" 2>/dev/null || continue
        if [[ $first =~ ^\#!.*(/|[[:space:]])(ba)?sh([[:space:]]|$) ]]; then
            scripts+=("$f")
        fi
    done
    [ ${#scripts[@]} -eq 0 ] && return 0
    shellcheck --external-sources --source-path=SCRIPTDIR "${scripts[@]}"
}

what=("$@")
[ ${#what[@]} -eq 0 ] && what=(banned shellcheck)
rc=0
for w in "${what[@]}"; do
    case $w in
    banned) check_banned || rc=1 ;;
    shellcheck) check_shellcheck || rc=1 ;;
    *)
        echo "usage: scripts/check-style.sh [banned|shellcheck]..." >&2
        exit 2
        ;;
    esac
done
exit "$rc"
