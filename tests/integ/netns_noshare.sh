#!/bin/bash
# Nodes without a shared filesystem: three nodes in their own network namespaces, each with
# its own copy of the job dir (job.json and key only); the followers are told the leader's
# address with --rendezvous HOST:PORT instead of reading endpoint.json. The rank library's
# example must pass across the nodes, and each node's rank logs land in its own job dir.
# timeout: 60
# lane: side
set -euo pipefail
# shellcheck source=tests/netns.sh disable=SC1091
. "$(dirname "$0")/../netns.sh"

NODES=3
NPROCS=2
WORLD=$((NODES * NPROCS))
netns_test_begin "$NODES" rendezvousd tests/gr_example
job0=$NETNS_WORK/job-ns-$$
netns_job_write "$job0" "$NODES" "$NPROCS" '"join_timeout_ms": 20000, "kill_grace_ms": 1000' \
    "$NETNS_BUILD/tests/gr_example"
declare -a dir daemon
for ((k = 0; k < NODES; k++)); do
    dir[k]=$NETNS_WORK/node$k/$(basename "$job0")
    if [ "$k" = 0 ]; then
        dir[k]=$job0
    else
        mkdir -p "${dir[k]}"
        chmod 0700 "${dir[k]}"
        cp -p "$job0/job.json" "$job0/key" "${dir[k]}/"
    fi
done

addr0=$(netns_addr 0)
netns_spawn -e "$NETNS_WORK/node0.err" 0 "$NETNS_WORK/node0.out" "$NETNS_BUILD/rendezvousd" \
    --job-dir "$job0" --node-rank 0 --bind "$addr0" --advertise "$addr0" --hostname node0
daemon[0]=$NETNS_PID
deadline=$(($(netns_now_ms) + 10000))
until [ -s "$job0/endpoint.json" ]; do
    [ "$(netns_now_ms)" -lt "$deadline" ] || fail "the leader wrote no endpoint.json within 10 s"
    netns__alive "${daemon[0]}" || fail "node 0's rendezvousd exited early"
    sleep 0.02
done
port=$(netns_json "$job0/endpoint.json" 'j["port"]')
for ((k = 1; k < NODES; k++)); do
    addr=$(netns_addr "$k")
    netns_spawn -e "$NETNS_WORK/node$k.err" "$k" "$NETNS_WORK/node$k.out" \
        "$NETNS_BUILD/rendezvousd" --job-dir "${dir[k]}" --node-rank "$k" \
        --rendezvous "$addr0:$port" --bind "$addr" --advertise "$addr" --hostname "node$k"
    daemon[k]=$NETNS_PID
done
for ((k = 0; k < NODES; k++)); do
    netns_wait "${daemon[k]}" 30000 || fail "node $k's rendezvousd still runs after 30 s"
    [ "$NETNS_STATUS" = 0 ] || fail "node $k's rendezvousd exited with status $NETNS_STATUS, not 0"
done

for ((r = 0; r < WORLD; r++)); do
    k=$((r / NPROCS))
    ok="rank $r/$WORLD local $((r % NPROCS)) node $k: store ok, barrier ok"
    grep -qxF "[$r] $ok" "$NETNS_WORK/node$k.out" || fail "node $k's output lacks '[$r] $ok'"
    grep -qxF "$ok" "${dir[k]}/logs/rank-$r.log" ||
        fail "node $k's own job dir has no logs/rank-$r.log with '$ok'"
done
for ((k = 1; k < NODES; k++)); do
    [ ! -e "${dir[k]}/endpoint.json" ] || fail "follower node $k wrote an endpoint.json"
done
got=$(netns_json "$job0/summary.json" '[j["outcome"], j["exit_status"]]')
[ "$got" = '["completed", 0]' ] || fail "summary.json outcome, exit_status = $got"
echo "# $WORLD ranks on $NODES nodes with separate job dirs, joined through --rendezvous: ok"
