#!/bin/bash
# Memory checkpoints across nodes on the Slurm test cluster (gpurun.memckpt; daemon/memlink.c
# between network namespaces): a 2-node job of 1 rank each with a spare; each rank saves its
# state, node 0 holds node 1's copy (its replica crosses the daemons' authenticated link),
# and rank 1 then kills its own node's rendezvousd. At the restart the spare takes node 1's
# place and its daemon fetches rank 1's copy from node 0: both ranks load their states of
# step 11, the log says where from, and gpurun status's "state from" column too.
# timeout: 180
# lane: side
set -euo pipefail
# shellcheck source=slurm_client_common.sh
. "$(dirname "$0")/slurm_client_common.sh"

job=$(cd "$here/../python" && pwd)/memckpt_job.py
[ -f "$job" ] || grs_fail "no '$job'"
rc=0
timeout 150 "$gpurun" --wait -N 2 --gpus-per-node 1 --spare-nodes 1 --kill-grace 1 \
    --log-level info -- "$py" "$job" spare >mem.out 2>mem.err </dev/null || rc=$?
[ "$rc" = 0 ] || grs_fail "the job exited $rc: $(tail -n 5 mem.err; tail -n 5 mem.out)"
id=$(job_id mem.out)
for r in 0 1; do
    grep -qF "[$r] rank $r generation 1 node_rank $r: state step 11 b'state of rank $r'" mem.out ||
        grs_fail "rank $r did not load its copy after the swap: $(grep "^\[$r\]" mem.out | tail -n 3)"
done
# The daemons' log comes with the job's output.
grep -q "rank 1 takes its memory checkpoint 'state' of step 11 (.* bytes) from node 0's memory (its replica: this node had none)" mem.out mem.err ||
    grs_fail "the log does not say that rank 1's state came from node 0's replica: $(grep -h 'takes its memory' mem.out mem.err)"
grep -q "node 0 sends its 1 memory checkpoint to node 2, its new holder" mem.out mem.err ||
    grs_fail "node 0 did not send its copy to the spare, its new holder"
rc=0
"$gpurun" status "$id" >status.out 2>&1 || rc=$?
[ "$rc" = 0 ] || grs_fail "gpurun status $id exited $rc: $(cat status.out)"
grep -qE '^1 +2 .* node 0, step 11( |$)' status.out ||
    grs_fail "status does not say rank 1's state came from node 0: $(grep -E '^(rank|[01]) ' status.out)"
echo "# rank 1's state crossed from node 1 to node 0 and back to the spare (node 2) through the daemons' links"
echo "ok - memory checkpoints outlived a node on Slurm"
