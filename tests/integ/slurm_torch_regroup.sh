#!/bin/bash
# A user's torch DDP script (gloo) regrouping in process through gpurun.inprocess.run on the
# Slurm test cluster (tests/python/regroup_job.py): 2 nodes of 1 rank and a spare, network
# namespaces of their own; after step 150 rank 1 kills its own node's rendezvousd (the rank
# dies with it). Rank 0 keeps its process and re-forms torch's process group with the spare's
# new rank, which takes rank 0's live state; the run ends with the parameters and Adam moments
# of an undisturbed run, bit for bit.
# Uses Debian's python3-torch (/usr/bin/python3); skips without it.
# timeout: 300
# lane: side
set -euo pipefail

python=${TORCH_PYTHON:-/usr/bin/python3}
if ! "$python" -c 'import importlib.util as u; assert u.find_spec("torch")' >/dev/null 2>&1; then
    echo "# SKIP '$python' has no torch (Debian's python3-torch)"
    exit 77
fi
job=$(cd "$(dirname "$0")/../.." && pwd)/tests/python/regroup_job.py
# shellcheck source=slurm_client_common.sh
. "$(dirname "$0")/slurm_client_common.sh"

steps=400
rc=0
timeout 150 "$gpurun" --wait -N 2 --gpus-per-node 1 -- "$python" "$job" "$steps" \
    >calm.out 2>calm.err </dev/null || rc=$?
[ "$rc" = 0 ] || grs_fail "the undisturbed run exited $rc: $(tail -n 5 calm.err calm.out)"
calm=$(sed -nE "s/^\[[01]\] regroup_job rank [01] steps $steps params ([0-9a-f]+)$/\1/p" calm.out |
    sort -u)
[ "$(grep -c . <<<"$calm")" = 1 ] || grs_fail "the undisturbed run: not one digest of 2 ranks: '$calm'"

rc=0
timeout 200 "$gpurun" --wait -N 2 --gpus-per-node 1 --spare-nodes 1 --max-restarts 1 \
    --kill-grace 1 --log-level info -- "$python" "$job" "$steps" 150 >hit.out 2>hit.err \
    </dev/null || rc=$?
[ "$rc" = 0 ] || grs_fail "the run whose node 1 was lost exited $rc: $(tail -n 5 hit.err hit.out)"
# The leader's lines come with the job's output.
grep -q "node 1 lost: the ranks of the other nodes regroup in process with the spare's, as generation 1" \
    hit.out hit.err || grs_fail "the leader did not regroup in process: $(grep -h 'lost\|regroup\|restart' hit.out hit.err | head -n 3)"
starts=$(sed -nE 's/^\[0\] start generation ([0-9]+) step ([0-9]+) call ([0-9]+) pid ([0-9]+)$/\1 \3 \4/p' hit.out |
    tr '\n' ' ')
read -r g1 c1 p1 g2 c2 p2 <<<"$starts" || true
[ "$g1 $c1 $g2 $c2 $p2" = "0 1 1 2 $p1" ] ||
    grs_fail "rank 0 did not go on in its own process as generation 1: '$starts'"
from=$(sed -nE 's/^\[0\] start generation 1 step ([0-9]+) .*/\1/p' hit.out)
grep -q "^\[1\] start generation 1 step $from call 1 pid " hit.out ||
    grs_fail "the spare's rank 1 did not start in generation 1 at step $from: $(grep '^\[1\] start' hit.out)"
hit=$(sed -nE "s/^\[[01]\] regroup_job rank [01] steps $steps params ([0-9a-f]+)$/\1/p" hit.out |
    sort | uniq -c | awk '{ print $1, $2 }')
[ "$hit" = "2 $calm" ] || grs_fail "the ranks' final digests '$hit', not 2 of the undisturbed run's $calm"
echo "ok - torch DDP on Slurm regrouped in process at step $from: the undisturbed run's parameters and moments, bit for bit"
