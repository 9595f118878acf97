#!/bin/bash
# A node's network dies: three nodes in their own network namespaces, two long-running ranks
# on each, a short heartbeat; then node 2's link goes down (no FIN, no RST: its packets just
# stop). Within about hb_timeout the leader must count node 2 as lost, fail the job with a
# cause that says so and tear down the ranks of nodes 0 and 1, while node 2's daemon, cut
# off from the leader, must fence itself: kill its own ranks and exit non-zero.
# timeout: 60
# lane: side
set -euo pipefail
# shellcheck source=tests/netns.sh disable=SC1091
. "$(dirname "$0")/../netns.sh"

NODES=3
NPROCS=2
WORLD=$((NODES * NPROCS))
# The node cut off: 2 by default; netns_leader_cut.sh cuts the leader's own, node 0.
CUT=${NETNS_LINKDOWN_CUT:-2}
HB_INTERVAL_MS=200
HB_TIMEOUT_MS=1500
KILL_GRACE_MS=500
# Detection takes up to hb_timeout (plus a heartbeat period of phase); the slack covers the
# teardown and a loaded machine.
DEADLINE_MS=$((HB_TIMEOUT_MS + HB_INTERVAL_MS + KILL_GRACE_MS + ${NETNS_LINKDOWN_SLACK_MS:-2500}))
netns_test_begin "$NODES" rendezvousd
job=$NETNS_WORK/job-ld-$$
pids=$NETNS_WORK/pids
mkdir -p "$pids"

# shellcheck disable=SC2016 # expanded by the rank's shell
rank_sh='echo $$ >"$T_PIDS/$RANK.tmp" && mv "$T_PIDS/$RANK.tmp" "$T_PIDS/$RANK"
while :; do sleep 1; done'
netns_job_write "$job" "$NODES" "$NPROCS" \
    "\"join_timeout_ms\": 20000, \"hb_interval_ms\": $HB_INTERVAL_MS, \"hb_timeout_ms\": $HB_TIMEOUT_MS, \"kill_grace_ms\": $KILL_GRACE_MS, \"env\": [\"T_PIDS=$pids\"]" \
    /bin/sh -c "$rank_sh"
netns_job_start "$job" "$NETNS_WORK" "$NETNS_BUILD/rendezvousd"

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
done
# A few heartbeats go by with the link up: a healthy job must not fail.
sleep $(((3 * HB_INTERVAL_MS + 999) / 1000))
for ((k = 0; k < NODES; k++)); do
    netns__alive "${NETNS_DAEMONS[k]}" || fail "node $k's rendezvousd exited before the cut"
done

t0=$(netns_now_ms)
netns_cut "$CUT"

# Every daemon ends: the others through the leader's abort, the cut one by fencing itself.
# Watch all of them at once, so that each one's time is its own.
declare -a exit_ms status
running=$NODES
while [ "$running" -gt 0 ]; do
    now=$(($(netns_now_ms) - t0))
    running=0
    for ((k = 0; k < NODES; k++)); do
        [ -n "${exit_ms[k]:-}" ] && continue
        if netns__alive "${NETNS_DAEMONS[k]}"; then
            running=$((running + 1))
            [ "$now" -lt "$DEADLINE_MS" ] ||
                fail "node $k's rendezvousd still runs $DEADLINE_MS ms after node $CUT's link went down"
        else
            exit_ms[k]=$now
            netns_wait "${NETNS_DAEMONS[k]}" 0
            status[k]=$NETNS_STATUS
        fi
    done
    sleep 0.01
done
echo "# leader_exit_ms=${exit_ms[0]} fence_ms=${exit_ms[CUT]} (hb_timeout_ms=$HB_TIMEOUT_MS)"
for ((k = 0; k < NODES; k++)); do
    [ "${status[k]}" != 0 ] || fail "node $k's rendezvousd exited 0 after losing node $CUT"
done
# Not long before the heartbeat timeout: the loss must come from hb_timeout_ms of silence
# (counted from the last heartbeat, which came up to a period before the cut, later on a
# loaded machine), as the cut itself tells neither side anything.
[ "${exit_ms[0]}" -ge $((HB_TIMEOUT_MS / 2)) ] ||
    fail "the leader ended ${exit_ms[0]} ms after the cut, before hb_timeout ($HB_TIMEOUT_MS ms)"

for ((r = 0; r < WORLD; r++)); do
    ! netns__alive "${rank_pid[r]}" ||
        fail "rank $r (pid ${rank_pid[r]}, node $((r / NPROCS))) still runs"
done
for ((k = 0; k < NODES; k++)); do
    left=$(ip netns pids "$(netns_name "$k")" | tr '\n' ' ')
    [ -z "$left" ] || fail "processes left on node $k after the job: $left"
done

[ -f "$job/summary.json" ] || fail "the leader wrote no summary.json"
got=$(netns_json "$job/summary.json" '[j["outcome"], j["exit_status"] != 0]')
[ "$got" = '["failed", true]' ] || fail "summary.json outcome, exit_status != 0 = $got"
cause=$(netns_json "$job/summary.json" 'j["first_failure"]["cause"]')
node=$(netns_json "$job/summary.json" 'j["first_failure"]["node"]')
echo "# summary cause: $cause"
[[ ${cause,,} == *lost* ]] || fail "summary.json cause '$cause' does not say the node was lost"
[ "$node" = "$CUT" ] || [[ $cause == *"node $CUT"* ]] ||
    fail "summary.json names node '$node' / cause '$cause', not node $CUT"
# Which side lost whom: the leader cut off lost every other node at once, and says so; a
# follower cut off is lost as the leader saw it, and it lost the leader.
if [ "$CUT" = 0 ]; then
    [[ $cause == "the leader (node 0, 'node0') lost all 2 other nodes at once"*"its own link"* ]] ||
        fail "summary.json cause '$cause' does not say the leader lost every other node"
    for ((k = 1; k < NODES; k++)); do
        grep -q "node $k lost the leader" "$NETNS_WORK/node$k.err" ||
            fail "node $k's rendezvousd did not log losing the leader"
    done
else
    [[ $cause == *"(seen by the leader, node 0)" ]] ||
        fail "summary.json cause '$cause' does not say which side saw the loss"
    grep -qi leader "$NETNS_WORK/node$CUT.err" ||
        fail "node $CUT's rendezvousd did not log losing the leader"
fi
echo "# node $CUT cut off: leader failed the job in ${exit_ms[0]} ms, node $CUT fenced itself in ${exit_ms[CUT]} ms"
