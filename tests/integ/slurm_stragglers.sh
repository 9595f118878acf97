#!/bin/bash
# Stragglers on the Slurm test cluster: a 2-node job whose ranks meet at a barrier every step
# (data parallelism's lockstep) and report their own step time; node 1's rank does twice the
# work of node 0's. gpurun --wait exits 0, the leader's log and summary.json name rank 1 on
# node 1 alone (not the rank that waits for it), and gpurun status of the finished job shows
# the straggler line.
# timeout: 180
# lane: side
set -euo pipefail
# shellcheck source=slurm_client_common.sh
. "$(dirname "$0")/slurm_client_common.sh"

cat >lockstep.py <<'EOF'
import time
import gpurun
own = 0.12 if gpurun.rank() == 1 else 0.05
for step in range(1, 41):
    t0 = time.monotonic()
    time.sleep(own)
    took = time.monotonic() - t0
    gpurun.barrier("step%d" % step, timeout=60)
    gpurun.report(step, step_time=took)
EOF

run lock.out lock.err --wait -N 2 --gpus-per-node 1 --python "$py" lockstep.py
expect_rc "the lockstep job" 0
id=$(job_id lock.out)
[ -n "$id" ] || grs_fail "no job id: $(cat lock.err)"
summary=$GPURUN_JOBS/$id/summary.json
[ "$(json "$summary" '[(s["rank"], s["node"]) for s in v["stragglers"]]')" = "[(1, 1)]" ] ||
    grs_fail "stragglers: $(json "$summary" 'v.get("stragglers")')"
run st.out st.err status "$id"
expect_rc "gpurun status" 0
grep -qE '^straggler: rank 1 on node 1 \(node[0-9]+\) [0-9]+% slower than the median over [0-9]+ steps' st.out ||
    grs_fail "status lacks the straggler line: $(cat st.out)"
echo "ok - the rank with twice the work named on Slurm, not the one waiting for it"
