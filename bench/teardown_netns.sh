#!/bin/bash
# Teardown latency across real IP links: three test nodes in their own network namespaces
# (tests/netns.sh), one rendezvousd each, four ranks per node. SIGKILL the last rank of node 2
# and time until every rank of every node is gone, and until every daemon has exited.
# Prints one line per repetition: "ranks_gone_ms=X watched_gone_ms=Y", or exits 77 with a
# "# SKIP reason" line when this machine cannot make namespaces.
#   bench/teardown_netns.sh LOADGEN RENDEZVOUSD REPS
set -euo pipefail
# shellcheck source=tests/netns.sh disable=SC1091
. "$(dirname "$0")/../tests/netns.sh"

LOADGEN=$1
RENDEZVOUSD=$2
REPS=${3:-3}
NODES=3
NPROCS=4
WORLD=$((NODES * NPROCS))
VICTIM=$((WORLD - 1))

work=
cleanup() {
    local rc=$?
    trap - EXIT
    netns_down
    [ -n "$work" ] && rm -rf "$work"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

rc=0
netns_up "$NODES" || rc=$?
[ "$rc" = 0 ] || exit "$rc"
work=$(mktemp -d "${TMPDIR:-/tmp}/gr-bench-netns.XXXXXX")

for ((rep = 0; rep < REPS; rep++)); do
    job=$work/job$rep
    pids=$work/pids$rep
    mkdir -p "$pids"
    netns_job_write "$job" "$NODES" "$NPROCS" \
        '"join_timeout_ms": 20000, "kill_grace_ms": 1000' "$LOADGEN" sleeper "$pids"
    netns_job_start "$job" "$work" "$RENDEZVOUSD"
    "$LOADGEN" teardown --pid-dir "$pids" --world "$WORLD" --victim "$VICTIM" \
        --watch "${NETNS_DAEMONS[0]}" --watch "${NETNS_DAEMONS[1]}" --watch "${NETNS_DAEMONS[2]}"
    for ((k = 0; k < NODES; k++)); do
        if ! netns_wait "${NETNS_DAEMONS[k]}" 5000; then
            echo "teardown_netns: node $k's rendezvousd still runs 5 s after the kill" >&2
            exit 1
        fi
        if [ "$NETNS_STATUS" != 137 ]; then
            echo "teardown_netns: node $k's rendezvousd exited $NETNS_STATUS, not 137" >&2
            tail -n 5 "$work/node$k.err" >&2 || true
            exit 1
        fi
    done
done
