#!/bin/bash
# The collectives' tcp ring across real interfaces: three nodes in their own network
# namespaces (tests/netns.sh), one rendezvousd each, two ranks per node, run tests/coll_rank
# check. Each rank must listen on its own node's address (the ring crosses the bridge between
# the namespaces, where 127.0.0.1 would reach nothing), and every rank's results must be
# bitwise the same. The namespaces share this machine's kernel and /dev/shm, so by default the
# links carry their data through shared memory; with GPURUN_COLL_SHM=0 every byte crosses the
# bridge over TCP, once with the agent's GPURUN_NODE_ADDR and once without it.
# timeout: 90
# lane: side
set -euo pipefail
# shellcheck source=tests/netns.sh disable=SC1091
. "$(dirname "$0")/../netns.sh"

NODES=3
NPROCS=2
WORLD=$((NODES * NPROCS))
netns_test_begin "$NODES" rendezvousd tests/coll_rank

# run NAME LINK ARGV...: one job of the ranks' ARGV on the three nodes, and its checks: every
# rank passed, and both of its links went over LINK ("shared memory" or "tcp").
run() {
    local name=$1 link=$2 job=$NETNS_WORK/job-$1-$$ k r t0 ok line
    shift 2
    netns_job_write "$job" "$NODES" "$NPROCS" '"join_timeout_ms": 20000, "kill_grace_ms": 1000' "$@"
    t0=$(netns_now_ms)
    netns_job_start "$job" "$NETNS_WORK" "$NETNS_BUILD/rendezvousd"
    for ((k = 0; k < NODES; k++)); do
        netns_wait "${NETNS_DAEMONS[k]}" 60000 ||
            fail "$name: node $k's rendezvousd still runs after 60 s"
        [ "$NETNS_STATUS" = 0 ] ||
            fail "$name: node $k's rendezvousd exited with status $NETNS_STATUS, not 0"
    done
    echo "# ${name}_job_ms=$(($(netns_now_ms) - t0))"
    for ((r = 0; r < WORLD; r++)); do
        k=$((r / NPROCS))
        ok="rank $r/$WORLD: all checks passed"
        grep -qxF "[$r] $ok" "$NETNS_WORK/node$k.out" ||
            fail "$name: node $k's output lacks '[$r] $ok'"
        line=$(grep -F "[$r] rank $r/$WORLD: tcp ring of $WORLD ranks: " "$NETNS_WORK/node$k.out") ||
            fail "$name: rank $r did not describe its ring"
        [ "$(grep -o "over $link" <<<"$line" | wc -l)" = 2 ] ||
            fail "$name: rank $r's links are not both over $link: $line"
        # Over TCP, the ring's peers are the other nodes' addresses, not loopback.
        [ "$link" = "shared memory" ] || ! grep -qF "127.0.0.1" <<<"$line" ||
            fail "$name: rank $r's ring runs over loopback: $line"
    done
    grep -qE '^\[0\] hash [0-9a-f]{16}$' "$NETNS_WORK/node0.out" ||
        fail "$name: rank 0 printed no hash"
    echo "# $name: $WORLD ranks on $NODES namespaced nodes: allreduce, broadcast, barrier ok"
}

run shm "shared memory" "$NETNS_BUILD/tests/coll_rank" check
run node_addr tcp /usr/bin/env GPURUN_COLL_SHM=0 "$NETNS_BUILD/tests/coll_rank" check
# Without the agent's GPURUN_NODE_ADDR a rank finds its address from the route to MASTER_ADDR.
run route tcp /usr/bin/env -u GPURUN_NODE_ADDR GPURUN_COLL_SHM=0 "$NETNS_BUILD/tests/coll_rank" check
