#!/bin/bash
# Fast teardown across nodes: three nodes in their own network namespaces, two long-running
# ranks on each; SIGKILL one rank on node 2. Every daemon must exit with 137 (the first
# failure, signal 9) within a couple of seconds, summary.json must name the rank and the
# signal, and no process of any rank may remain on any node. Prints the time from the kill
# to the last rank gone as "# teardown_ms=N".
# timeout: 60
# lane: side
set -euo pipefail
# shellcheck source=tests/netns.sh disable=SC1091
. "$(dirname "$0")/../netns.sh"

NODES=3
NPROCS=2
WORLD=$((NODES * NPROCS))
VICTIM=5 # local rank 1 of node 2
# The ranks are gone within kill_grace of the abort; the rest is the abort's way round the
# nodes and the daemons' exit, on a machine where other builds may be running.
DEADLINE_MS=${NETNS_TEARDOWN_DEADLINE_MS:-3000}
netns_test_begin "$NODES" rendezvousd
job=$NETNS_WORK/job-td-$$
pids=$NETNS_WORK/pids
mkdir -p "$pids"

# A rank publishes its pid (atomically) and loops; its 'sleep' children are in its process
# group, which the daemons must kill as a whole.
# shellcheck disable=SC2016 # expanded by the rank's shell
rank_sh='echo $$ >"$T_PIDS/$RANK.tmp" && mv "$T_PIDS/$RANK.tmp" "$T_PIDS/$RANK"
while :; do sleep 1; done'
netns_job_write "$job" "$NODES" "$NPROCS" \
    "\"join_timeout_ms\": 20000, \"kill_grace_ms\": 1000, \"env\": [\"T_PIDS=$pids\"]" \
    /bin/sh -c "$rank_sh"
netns_job_start "$job" "$NETNS_WORK" "$NETNS_BUILD/rendezvousd"

# All ranks running.
deadline=$(($(netns_now_ms) + 20000))
while [ "$(find "$pids" -name '[0-9]*' ! -name '*.tmp' | wc -l)" -lt "$WORLD" ]; do
    [ "$(netns_now_ms)" -lt "$deadline" ] || fail "not all $WORLD ranks started within 20 s"
    for ((k = 0; k < NODES; k++)); do
        netns__alive "${NETNS_DAEMONS[k]}" || fail "node $k's rendezvousd exited early"
    done
    sleep 0.05
done
declare -a rank_pid
for ((r = 0; r < WORLD; r++)); do
    rank_pid[r]=$(cat "$pids/$r")
    netns__alive "${rank_pid[r]}" || fail "rank $r (pid ${rank_pid[r]}) is not running"
done
victim_ns=$(readlink "/proc/${rank_pid[VICTIM]}/ns/net")
[ "$victim_ns" = "$(stat -L -c 'net:[%i]' "/run/netns/$(netns_name 2)")" ] ||
    fail "rank $VICTIM does not run in node 2's namespace ($victim_ns)"

t0=$(netns_now_ms)
kill -KILL "${rank_pid[VICTIM]}"

# Time until the last rank process is gone.
left=1
while [ "$left" = 1 ]; do
    left=0
    for ((r = 0; r < WORLD; r++)); do
        if netns__alive "${rank_pid[r]}"; then
            left=1
            break
        fi
    done
    [ "$left" = 0 ] && break
    [ "$(($(netns_now_ms) - t0))" -lt "$DEADLINE_MS" ] ||
        fail "rank $r (pid ${rank_pid[r]}) still runs $DEADLINE_MS ms after the kill"
    sleep 0.005
done
teardown_ms=$(($(netns_now_ms) - t0))
echo "# teardown_ms=$teardown_ms"

for ((k = 0; k < NODES; k++)); do
    wait_ms=$((DEADLINE_MS - ($(netns_now_ms) - t0)))
    netns_wait "${NETNS_DAEMONS[k]}" $((wait_ms > 0 ? wait_ms : 0)) ||
        fail "node $k's rendezvousd still runs $DEADLINE_MS ms after the kill"
    [ "$NETNS_STATUS" = 137 ] ||
        fail "node $k's rendezvousd exited with $NETNS_STATUS, not 137 (rank $VICTIM's SIGKILL)"
done
echo "# daemons_exited_ms=$(($(netns_now_ms) - t0))"

# Nothing of the job is left on any node: with the daemons gone, a namespace's processes
# can only be ranks or their children.
for ((k = 0; k < NODES; k++)); do
    left=$(ip netns pids "$(netns_name "$k")" | tr '\n' ' ')
    [ -z "$left" ] || fail "processes left on node $k after the job: $left"
done

[ -f "$job/summary.json" ] || fail "the leader wrote no summary.json"
got=$(netns_json "$job/summary.json" \
    '[j["outcome"], j["exit_status"], j["first_failure"]["rank"], j["first_failure"]["node"], j["first_failure"]["signal"]]')
[ "$got" = "[\"failed\", 137, $VICTIM, 2, 9]" ] ||
    fail "summary.json outcome, exit_status, first_failure rank, node, signal = $got"
grep -qF "job failed: rank $VICTIM on node 2 ('node2')" "$NETNS_WORK"/node*.out "$NETNS_WORK"/node*.err ||
    fail "no daemon printed 'job failed: rank $VICTIM on node 2 ('node2') ...'"
echo "# rank $VICTIM killed on node 2: all $WORLD ranks gone in $teardown_ms ms, every daemon exited 137"
