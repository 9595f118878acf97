#!/bin/bash
# Memory checkpoints on the Slurm test cluster, both copies of a rank's state lost: a job of 3
# nodes of 1 rank and 2 spares on a cluster of 5 (network namespaces); each rank saves its
# state; once rank 1's copy is on node 2 (its holder) and rank 2's on node 0, rank 1 kills the
# daemons of node 2 and of its own node. At the restart rank 1 finds no copy and says so (a
# trainer's disk then serves); ranks 0 and 2 load theirs, rank 2's from node 0.
# timeout: 240
# lane: side
set -euo pipefail
export GR_SLURM_NODES=5
# shellcheck source=slurm_client_common.sh
. "$(dirname "$0")/slurm_client_common.sh"

job=$(cd "$here/../python" && pwd)/memckpt_job.py
[ -f "$job" ] || grs_fail "no '$job'"
rc=0
timeout 200 "$gpurun" --wait -N 3 --gpus-per-node 1 --spare-nodes 2 --max-restarts 1 \
    --kill-grace 1 --log-level info -- "$py" "$job" both >both.out 2>both.err </dev/null || rc=$?
[ "$rc" = 0 ] || grs_fail "the job exited $rc: $(tail -n 5 both.err; tail -n 5 both.out)"
grep -qF "[1] rank 1 generation 1: no copy, from disk" both.out ||
    grs_fail "rank 1 found a copy with both lost: $(grep '^\[1\]' both.out | tail -n 3)"
for r in 0 2; do
    grep -qF "[$r] rank $r generation 1: state step 13 b'state of rank $r'" both.out ||
        grs_fail "rank $r did not load its copy with nodes 1 and 2 lost: $(grep "^\[$r\]" both.out | tail -n 3)"
done
grep -q "rank 2 takes its memory checkpoint 'state' of step 13 (.* bytes) from node 0's memory (its replica: this node had none)" \
    both.out both.err ||
    grs_fail "the log does not say that rank 2's state came from node 0: $(grep -h 'takes its memory' both.out both.err)"
echo "ok - memory checkpoints on Slurm: both copies of rank 1's state lost, it says so; ranks 0 and 2 loaded theirs"
