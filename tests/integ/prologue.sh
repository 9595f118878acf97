# The start every integration script shares (sourced, not run: tests/integ/README). A script
# sources it after `set -euo pipefail`, directly or through a common file (local_common.sh,
# tests/netns.sh's netns_test_begin), and then has:
#   root, build   the source tree's root and the build dir ($BUILD, else build; relative to the
#                 root unless absolute), both absolute
#   work          a fresh scratch dir under $TEST_TMPDIR (else $TMPDIR, else /tmp)
#   skip REASON   prints "# SKIP REASON" and exits 77
#   fail REASON   prints "FAIL: REASON" and exits 1
#   show FILE     FILE's last $show_lines lines (default 40) as "# " lines, for context
#   need_built [--hint TEXT] PROGRAM...   skips unless each $build/PROGRAM is built ("make", or
#                 TEXT, says how to build it)
# and an EXIT trap that, in this order: runs the commands of exit_hooks (stop daemons...); stops
# the pids in bg_pids (SIGTERM, then waits for each); when the script failed (a status other
# than 0 and 77), shows the files of fail_show (globs under $work, default "out err": set it to
# the files that tell what went wrong); removes $work when it passed or skipped, else (or with
# TEST_KEEP_TMPDIR set) keeps it and says where. SIGHUP, SIGINT and SIGTERM (the runner's
# timeout) end the script through exit, so that the trap runs then too.
# shellcheck shell=bash
# The variables set here are read by the scripts that source this file.
# shellcheck disable=SC2034

# Sourced twice (a common file and its script): once is enough.
[ -z "${prologue_done:-}" ] || return 0
prologue_done=1

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${BUILD:-build}
[[ $build == /* ]] || build=$root/$build

show_lines=40
fail_show=(out err)
exit_hooks=()
bg_pids=()

skip() {
    echo "# SKIP $*"
    exit 77
}

fail() {
    echo "FAIL: $*"
    exit 1
}

# show FILE: its last lines as "# " lines, named relative to $work.
show() {
    [ -s "$1" ] || return 0
    echo "# --- ${1#"$work"/} (last $show_lines lines)"
    tail -n "$show_lines" "$1" | sed 's/^/# /'
}

need_built() {
    local hint=make p
    if [ "${1:-}" = --hint ]; then
        hint=$2
        shift 2
    fi
    for p in "$@"; do
        [ -x "$build/$p" ] || skip "'$build/$p' is not built ($hint)"
    done
}

prologue_exit() {
    local rc=$? hook pid pattern f
    trap - EXIT
    for hook in "${exit_hooks[@]}"; do
        $hook || true
    done
    for pid in "${bg_pids[@]}"; do
        kill -TERM "$pid" 2>/dev/null || true
    done
    for pid in "${bg_pids[@]}"; do
        wait "$pid" 2>/dev/null || true
    done
    if [ "$rc" != 0 ] && [ "$rc" != 77 ]; then
        for pattern in "${fail_show[@]}"; do
            # Unquoted: each pattern is a glob.
            for f in "$work"/$pattern; do
                show "$f"
            done
        done
    fi
    if { [ "$rc" = 0 ] || [ "$rc" = 77 ]; } && [ -z "${TEST_KEEP_TMPDIR:-}" ]; then
        rm -rf "$work"
    else
        echo "# scratch kept: $work"
    fi
    exit "$rc"
}

work=$(mktemp -d "${TEST_TMPDIR:-${TMPDIR:-/tmp}}/gpurun-$(basename "$0" .sh).XXXXXX")
trap prologue_exit EXIT
trap 'exit 129' HUP
trap 'exit 130' INT
trap 'exit 143' TERM
