#!/bin/bash
# Three nodes in their own network namespaces, one rendezvousd each, two ranks per node: the
# followers find the leader through endpoint.json in the shared job dir, every rank gets the
# torch environment (RANK ... MASTER_ADDR = node 0's address), runs in its node's namespace,
# and the rank library's example passes its store and barrier across the nodes.
# timeout: 60
# lane: side
set -euo pipefail
# shellcheck source=tests/netns.sh disable=SC1091
. "$(dirname "$0")/../netns.sh"

NODES=3
NPROCS=2
WORLD=$((NODES * NPROCS))
netns_test_begin "$NODES" rendezvousd tests/gr_example
job=$NETNS_WORK/job-rdv-$$

# The rank prints its environment in one line, then becomes the library's example.
# shellcheck disable=SC2016 # expanded by the rank's shell
rank_sh='echo "env RANK=$RANK LOCAL_RANK=$LOCAL_RANK WORLD_SIZE=$WORLD_SIZE'\
' LOCAL_WORLD_SIZE=$LOCAL_WORLD_SIZE NODE_RANK=$NODE_RANK GROUP_RANK=$GROUP_RANK'\
' MASTER_ADDR=$MASTER_ADDR MASTER_PORT=$MASTER_PORT NETNS=$(readlink /proc/self/ns/net)'\
' JOB_DIR=$GPURUN_JOB_DIR SOCK=${GPURUN_SOCK:+set} TOKEN=${GPURUN_TOKEN:+set}"; exec "$0"'
netns_job_write "$job" "$NODES" "$NPROCS" \
    '"join_timeout_ms": 20000, "kill_grace_ms": 1000' \
    /bin/sh -c "$rank_sh" "$NETNS_BUILD/tests/gr_example"

t0=$(netns_now_ms)
netns_job_start "$job" "$NETNS_WORK" "$NETNS_BUILD/rendezvousd"
for ((k = 0; k < NODES; k++)); do
    netns_wait "${NETNS_DAEMONS[k]}" 30000 || fail "node $k's rendezvousd still runs after 30 s"
    [ "$NETNS_STATUS" = 0 ] || fail "node $k's rendezvousd exited with status $NETNS_STATUS, not 0"
done
echo "# job_ms=$(($(netns_now_ms) - t0))"

addr0=$(netns_addr 0)
[ -f "$job/endpoint.json" ] || fail "no endpoint.json in the job dir"
host=$(netns_json "$job/endpoint.json" 'j["host"]')
[ "$host" = "$addr0" ] || fail "endpoint.json host is '$host', not node 0's '$addr0'"
netns_json "$job/endpoint.json" 'j["port"]' | grep -qE '^[1-9][0-9]*$' ||
    fail "endpoint.json has no port"

# Every rank's line from its own node's daemon, with one MASTER_PORT for the whole job.
port=$(sed -n 's/^\[0\] env .* MASTER_PORT=\([0-9]*\) .*/\1/p' "$NETNS_WORK/node0.out")
[ -n "$port" ] || fail "rank 0 printed no MASTER_PORT"
for ((r = 0; r < WORLD; r++)); do
    k=$((r / NPROCS))
    out=$NETNS_WORK/node$k.out
    netns=$(stat -L -c 'net:[%i]' "/run/netns/$(netns_name "$k")")
    want="[$r] env RANK=$r LOCAL_RANK=$((r % NPROCS)) WORLD_SIZE=$WORLD"
    want+=" LOCAL_WORLD_SIZE=$NPROCS NODE_RANK=$k GROUP_RANK=$k MASTER_ADDR=$addr0"
    want+=" MASTER_PORT=$port NETNS=$netns JOB_DIR=$job SOCK=set TOKEN=set"
    grep -qxF "$want" "$out" || {
        echo "# want: $want"
        grep -F "[$r] env" "$out" | sed 's/^/# got:  /'
        fail "rank $r's environment on node $k is wrong or missing"
    }
    ok="rank $r/$WORLD local $((r % NPROCS)) node $k: store ok, barrier ok"
    grep -qxF "[$r] $ok" "$out" || fail "node $k's output lacks '[$r] $ok'"
    grep -qxF "$ok" "$job/logs/rank-$r.log" || fail "logs/rank-$r.log lacks '$ok'"
    for ((o = 0; o < NODES; o++)); do
        [ "$o" = "$k" ] && continue
        ! grep -qF "[$r] " "$NETNS_WORK/node$o.out" ||
            fail "rank $r's output appears on node $o, not only on node $k"
    done
done

[ -f "$job/summary.json" ] || fail "the leader wrote no summary.json"
outcome=$(netns_json "$job/summary.json" 'j["outcome"], j["exit_status"], j["first_failure"]')
[ "$outcome" = '["completed", 0, null]' ] ||
    fail "summary.json says outcome, exit_status, first_failure = $outcome"
# The leader knows each node by the address and name it advertised.
nodes=$(netns_json "$job/summary.json" '" ".join("%s=%s/%s" % (n["node"], n["addr"], n["hostname"]) for n in j["nodes"])')
want=""
for ((k = 0; k < NODES; k++)); do
    want+="${want:+ }$k=$(netns_addr "$k")/node$k"
done
[ "$nodes" = "$want" ] || fail "summary.json nodes are '$nodes', not '$want'"
echo "# $WORLD ranks on $NODES nodes: environment, store and barrier ok"
