#!/bin/bash
# Pre-flight's link test on the Slurm test cluster: node2's link shaped to 10 Mbit/s (tc's
# token bucket on its side of its veth). A 2-node job with --spare-nodes 1 on node1..node3
# (node1 runs the leader, node2 serves as job node 1, node3 is the spare): node2 fails
# pre-flight, named with its link's figure and the median, is fenced, and node3 runs rank 1;
# the job completes and gpurun status says the swap. Then gpurun preflight on the same three
# nodes: node2's line fails on its link, the others pass, exit 125.
# timeout: 180
# lane: side
set -euo pipefail
# shellcheck source=slurm_client_common.sh
. "$(dirname "$0")/slurm_client_common.sh"

command -v tc >/dev/null || { echo "# SKIP no tc (iproute2) to shape a link"; exit 77; }
grs_exec 2 tc qdisc add dev eth0 root tbf rate 10mbit burst 16kbit latency 400ms ||
    { echo "# SKIP this kernel has no token bucket qdisc (sch_tbf) to shape a link"; exit 77; }

rc=0
# shellcheck disable=SC2016 # expanded by each rank
timeout 120 "$gpurun" --wait -N 2 --gpus-per-node 1 --spare-nodes 1 -w node1,node2,node3 -- \
    sh -c 'echo "rank $RANK on $(hostname)"' >link.out 2>link.err </dev/null || rc=$?
[ "$rc" = 0 ] || grs_fail "--wait exited $rc: $(tail -n 5 link.err)"
id=$(job_id link.out)
summary=$GPURUN_JOBS/$id/summary.json
why=$(json "$summary" 'v["nodes"][1].get("preflight", "")')
[[ "$why" =~ ^link\ to\ the\ leader\ ([0-9]+)\ Mbit/s,\ median\ of\ the\ nodes\ ([0-9]+)\ Mbit/s$ ]] ||
    grs_fail "node 1's pre-flight: '$why'; summary: $(head -n 60 "$summary")"
echo "# node2: ${BASH_REMATCH[1]} Mbit/s, median ${BASH_REMATCH[2]} Mbit/s"
[ "$(json "$summary" '[(n["hostname"], n["state"]) for n in v["nodes"]]')" = \
    "[('node1', 'done'), ('node2', 'fenced'), ('node3', 'done')]" ] ||
    grs_fail "nodes: $(json "$summary" '[(n["hostname"], n["state"]) for n in v["nodes"]]')"
[ "$(json "$summary" '[(s["node"], s["spare"], s["generation"]) for s in v["swaps"]]')" = "[(1, 2, 0)]" ] ||
    grs_fail "swaps: $(json "$summary" 'v.get("swaps")')"
grep -qx '\[1\] rank 1 on node3' link.out || grs_fail "rank 1 not on node3: $(cat link.out)"
"$gpurun" status "$id" >st.out 2>&1 || true
grep -q "failed pre-flight: link to the leader" st.out ||
    grs_fail "gpurun status does not say the swap: $(cat st.out)"

# gpurun preflight: the checks alone, on the same three nodes; node2's line says its link.
# The cluster has no NVML: --min-gpu-free 0, or each line says the memory check is skipped.
rc=0
timeout 120 "$gpurun" preflight -N 3 --gpus-per-node 1 --min-gpu-free 0 -w node1,node2,node3 \
    >pf.out 2>pf.err </dev/null || rc=$?
[ "$rc" = 125 ] || grs_fail "gpurun preflight exited $rc: $(cat pf.out; tail -n 5 pf.err)"
grep -qE '^node 1 \(node2\): FAILED: link to the leader [0-9]+ Mbit/s, median of the nodes [0-9]+ Mbit/s; link [0-9]+ Mbit/s$' pf.out ||
    grs_fail "gpurun preflight's node 1: $(cat pf.out)"
grep -qE '^node 2 \(node3\): passed; link [0-9]+ Mbit/s$' pf.out || grs_fail "gpurun preflight's node 2: $(cat pf.out)"
grep -qx 'node 0 (node1): passed' pf.out || grs_fail "gpurun preflight's node 0: $(cat pf.out)"
grep -qx 'pre-flight: 2 of 3 nodes passed' pf.out || grs_fail "gpurun preflight's last line: $(cat pf.out)"
sed 's/^/# /' pf.out
echo "ok - node2's slow link named by pre-flight on Slurm; node3 took its place; gpurun preflight names it"
