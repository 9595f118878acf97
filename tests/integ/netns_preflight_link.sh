#!/bin/bash
# Pre-flight's link test: four nodes in their own network namespaces, node 2's link shaped to
# 10 Mbit/s (tc's token bucket on its side of the veth), the others at the speed of a veth.
# Before any rank starts the leader times each node's link (the probe frames it sends before
# its join): with a hot spare, node 2 fails pre-flight with its figure and the median's, is
# fenced, and the spare (node 3) takes its place: the job completes. Without a spare the job
# ends with 125 before any rank starts, its first failure naming node 2's link. A third run
# with --preflight off (job.json's "preflight": 0) times nothing and runs on node 2.
# timeout: 90
# lane: side
set -euo pipefail
# shellcheck source=tests/netns.sh disable=SC1091
. "$(dirname "$0")/../netns.sh"

NODES=4
SLOW=2
netns_test_begin "$NODES" rendezvousd
command -v tc >/dev/null || skip "no tc (iproute2) to shape a link"
netns_exec "$SLOW" tc qdisc add dev eth0 root tbf rate 10mbit burst 16kbit latency 400ms ||
    skip "this kernel has no token bucket qdisc (sch_tbf) to shape a link"

# run NAME NNODES MEMBERS: a job of NNODES nodes (and NODES - NNODES spares) whose one rank per
# node says its rank (into its node's NAME/nodeK.out); waits for the daemons; sets rc to node
# 0's exit status.
run() {
    local job=$NETNS_WORK/$1 k
    # shellcheck disable=SC2016 # expanded by the rank's shell
    netns_job_write "$job" "$2" 1 \
        "\"join_timeout_ms\": 20000, \"spare_nodes\": $((NODES - $2))${3:+, $3}" \
        /bin/sh -c 'echo "rank $RANK up"'
    netns_job_start "$job" "$NETNS_WORK/$1" "$NETNS_BUILD/rendezvousd"
    netns_wait "${NETNS_DAEMONS[0]}" 30000 || fail "$1: node 0's rendezvousd still runs after 30 s"
    rc=$NETNS_STATUS
    for ((k = 1; k < NODES; k++)); do
        netns_wait "${NETNS_DAEMONS[k]}" 10000 || fail "$1: node $k's rendezvousd still runs"
    done
    JOB=$job
}

# --- a spare: node 2 fenced, node 3 in its place ------------------------------------------------
mkdir -p "$NETNS_WORK/spare"
run spare 3 ""
[ "$rc" = 0 ] || fail "the job with a spare exited $rc: $(cat "$NETNS_WORK/spare/node0.err")"
state=$(netns_json "$JOB/summary.json" 'j["nodes"][2]["state"]')
why=$(netns_json "$JOB/summary.json" 'j["nodes"][2].get("preflight", "")')
[ "$state" = fenced ] || fail "node 2 is '$state', not fenced: $(cat "$JOB/summary.json")"
[[ "$why" =~ ^link\ to\ the\ leader\ ([0-9]+)\ Mbit/s,\ median\ of\ the\ nodes\ ([0-9]+)\ Mbit/s$ ]] ||
    fail "node 2's pre-flight says '$why'"
slow=${BASH_REMATCH[1]} median=${BASH_REMATCH[2]}
echo "# node 2: $slow Mbit/s, median $median Mbit/s"
[ "$slow" -le 12 ] || fail "node 2's shaped link timed at $slow Mbit/s (10 asked)"
for k in 1 3; do
    v=$(netns_json "$JOB/summary.json" "j['nodes'][$k].get('link_mbit', 0)")
    python3 -c "import sys; sys.exit(not float(sys.argv[1]) > 10 * 10)" "$v" ||
        fail "node $k's link timed at $v Mbit/s"
    [ -z "$(netns_json "$JOB/summary.json" "j['nodes'][$k].get('preflight', '')")" ] ||
        fail "node $k failed pre-flight: $(cat "$JOB/summary.json")"
done
[ "$(netns_json "$JOB/summary.json" 'j["nodes"][0].get("link_mbit", 0)')" = 0 ] ||
    fail "node 0 (the leader's own host) was timed"
[ "$(netns_json "$JOB/summary.json" 'j["swaps"][0]["spare"]')" = 3 ] ||
    fail "no swap of node 2 for node 3: $(cat "$JOB/summary.json")"
grep -q "node 2 ('node2') fenced: failed pre-flight: link to the leader" "$NETNS_WORK/spare/node0.err" ||
    fail "the leader's log does not say the swap: $(cat "$NETNS_WORK/spare/node0.err")"
grep -qxF '[2] rank 2 up' "$NETNS_WORK/spare/node3.out" ||
    fail "node 3 ran no rank 2: $(cat "$NETNS_WORK"/spare/node*.out)"
[ ! -s "$NETNS_WORK/spare/node2.out" ] || fail "node 2 ran a rank: $(cat "$NETNS_WORK/spare/node2.out")"

# --- no spare: the job ends before any rank starts ---------------------------------------------
mkdir -p "$NETNS_WORK/nospare"
run nospare 4 ""
[ "$rc" = 125 ] || fail "the job without a spare exited $rc, not 125"
cause=$(netns_json "$JOB/summary.json" 'j["first_failure"]["cause"]')
[[ "$cause" == "node 2 ('node2') failed pre-flight: link to the leader "*" Mbit/s, median of the nodes "*" Mbit/s" ]] ||
    fail "first failure: '$cause'"
[ "$(netns_json "$JOB/summary.json" 'j["first_failure"]["class"]')" = node ] ||
    fail "the failure's class is not 'node': $(cat "$JOB/summary.json")"
! grep -qh 'rank [0-9]* up' "$NETNS_WORK"/nospare/node*.out || fail "a rank ran: $(cat "$NETNS_WORK"/nospare/node*.out)"

# --- a requeued job's segment 1: node 1's host, fenced in segment 0, is refused -------------
mkdir -p "$NETNS_WORK/requeued/job/segments"
cat >"$NETNS_WORK/requeued/job/segments/0.json" <<'EOF'
{"outcome": "completed", "exit_status": 0, "nodes": [{"node": 0, "hostname": "node0", "state": "done"}, {"node": 1, "hostname": "node1", "state": "fenced"}]}
EOF
export SLURM_RESTART_COUNT=1
run requeued/job 3 '"preflight": 0'
unset SLURM_RESTART_COUNT
[ "$rc" = 0 ] || fail "the requeued job exited $rc"
[ "$(netns_json "$JOB/summary.json" 'j["nodes"][1]["state"]')" = fenced ] ||
    fail "node 1 (fenced in segment 0) is not fenced: $(cat "$JOB/summary.json")"
[ "$(netns_json "$JOB/summary.json" 'j["nodes"][1]["preflight"]')" = "fenced in segment 0 of this job (before its requeue)" ] ||
    fail "node 1's pre-flight: $(netns_json "$JOB/summary.json" 'j["nodes"][1]')"
[ "$(netns_json "$JOB/summary.json" 'j["segments"][0]["fenced"]')" = '["node1"]' ] ||
    fail "segments: $(netns_json "$JOB/summary.json" 'j["segments"]')"

# --- --preflight off: nothing timed, node 2 runs its rank ---------------------------------------
mkdir -p "$NETNS_WORK/off"
run off 4 '"preflight": 0'
[ "$rc" = 0 ] || fail "the job with pre-flight off exited $rc"
[ "$(netns_json "$JOB/summary.json" '[n.get("link_mbit", 0) for n in j["nodes"]]')" = "[0, 0, 0, 0]" ] ||
    fail "links timed with pre-flight off: $(cat "$JOB/summary.json")"
grep -qxF '[2] rank 2 up' "$NETNS_WORK/off/node2.out" || fail "node 2 ran no rank with pre-flight off"
echo "# node 2's slow link fenced with a spare, the job ended 125 without one, ran with pre-flight off"
