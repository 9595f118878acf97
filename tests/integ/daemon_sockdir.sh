#!/usr/bin/env bash
# Leftovers of an agent killed by SIGKILL: its socket directory (TMPDIR/gpurun-<pid>-XXXXXX)
# stays, since nothing of it runs to remove it; the next job's agent removes it at start, and
# leaves none of its own when it ends.
# timeout: 120
set -euo pipefail
# shellcheck source=local_common.sh
. "$(dirname "$0")/local_common.sh"

shopt -s nullglob
export TMPDIR=$work/tmp
mkdir -p "$TMPDIR"

# The first job: one node, one rank that says it is up and sleeps.
"$gpurun" --local -N 1 --gpus-per-node 1 --kill-grace 1 --job-dir "$work/first" -- \
    sh -c 'echo up; exec sleep 60' >"$work/out" 2>"$work/err" </dev/null &
pid=$!
bg_pids+=("$pid")
wait_for_lines "$work/out" 1

dirs=("$TMPDIR"/gpurun-*-*)
[ "${#dirs[@]}" = 1 ] || fail "expected one socket directory in '$TMPDIR', found: ${dirs[*]}"
stale=${dirs[0]}
agent=${stale##*/gpurun-}
agent=${agent%-*}
[[ $agent =~ ^[0-9]+$ ]] || fail "socket directory '$stale' does not carry a pid"
[ "$(cat "/proc/$agent/comm" 2>/dev/null)" = rendezvousd ] ||
    fail "pid $agent of '$stale' is not the agent (comm: $(cat "/proc/$agent/comm" 2>/dev/null))"
[ -S "$stale/agent.sock" ] || fail "no agent.sock in '$stale'"

kill -KILL "$agent"
rc=0
timeout -k 5 30 tail --pid="$pid" -f /dev/null || fail "gpurun did not end after its agent was killed"
wait "$pid" || rc=$?
echo "# first job: agent $agent killed, gpurun ended with $rc"
[ -d "$stale" ] || fail "the killed agent's directory '$stale' is gone already: nothing to test"

# The next job on the node removes it, and its own once done.
run --local -N 1 --gpus-per-node 1 --job-dir "$work/second" -- true
expect_rc 0 "the second job"
[ ! -e "$stale" ] || fail "the killed agent's directory '$stale' is still there after the next job"
left=("$TMPDIR"/gpurun-*)
[ "${#left[@]}" = 0 ] || fail "socket directories left after the second job: ${left[*]}"
echo "# '$stale' removed by the next job's agent; nothing left"
