#!/bin/bash
# Hot spares on the Slurm test cluster: a 2-node job with --spare-nodes 1 (and no
# --max-restarts: the spare implies one restart, which gpurun says at submit time) is a 3-node
# allocation; node 1's rendezvousd SIGKILLed mid-run, the spare (node 2) takes its place at
# the restart and the job completes: gpurun --wait exits 0, summary.json records the swap,
# rank 1 ran on the spare's host in generation 1 with NODE_RANK 1, and no process is left.
# The job's nodes pass pre-flight with the cluster's fake GPUs (CUDA_VISIBLE_DEVICES).
# timeout: 240
# lane: side
set -euo pipefail
# shellcheck source=slurm_client_common.sh
. "$(dirname "$0")/slurm_client_common.sh"

# shellcheck disable=SC2016 # expanded by each rank
timeout 150 "$gpurun" --wait -N 2 --gpus-per-node 1 --spare-nodes 1 \
    --kill-grace 1 -- sh -c 'echo "gen $GPURUN_RESTART_COUNT rank $RANK node_rank $NODE_RANK on $(hostname)"
if [ "$GPURUN_RESTART_COUNT" = 0 ]; then exec sleep 3011; fi' >spare.out 2>spare.err </dev/null &
gpid=$!
id=
for ((i = 0; i < 150; i++)); do
    id=$(job_id spare.out)
    [ -n "$id" ] && break
    sleep 0.2
done
[ -n "$id" ] || grs_fail "no job id: $(cat spare.err)"
for ((i = 0; i < 150; i++)); do
    [ "$(grep -c '^\[[01]\] gen 0 ' spare.out)" = 2 ] && break
    sleep 0.2
done
[ "$(grep -c '^\[[01]\] gen 0 ' spare.out)" = 2 ] || grs_fail "generation 0 did not start: $(tail -n 5 spare.err)"
victim=$(daemon_pid "$id" 1)
[ -n "$victim" ] || grs_fail "no rendezvousd of node 1"
kill -KILL "$victim"
rc=0
wait "$gpid" || rc=$?
grep -qxF "gpurun: --spare-nodes 1: up to 1 restart after a node or hang failure, for a spare to take the failed node's place (--max-restarts sets another number)" spare.err ||
    grs_fail "gpurun did not say at submit time what the spare implies: $(head -n 3 spare.err)"
[ "$rc" = 0 ] || grs_fail "--wait exited $rc: $(tail -n 5 spare.err); summary: $(head -n 40 "$GPURUN_JOBS/$id/summary.json" 2>&1)"
summary=$GPURUN_JOBS/$id/summary.json
[ "$(json "$summary" '[(s["node"], s["spare"], s["generation"]) for s in v["swaps"]]')" = "[(1, 2, 1)]" ] ||
    grs_fail "swaps: $(json "$summary" 'v.get("swaps")')"
[ "$(json "$summary" '[n["state"] for n in v["nodes"]]')" = "['done', 'fenced', 'done']" ] ||
    grs_fail "node states: $(json "$summary" '[n["state"] for n in v["nodes"]]')"
spare_host=$(json "$summary" 'v["nodes"][2]["hostname"]')
grep -qx "\[1\] gen 1 rank 1 node_rank 1 on $spare_host" spare.out ||
    grs_fail "rank 1 of generation 1 not on the spare ($spare_host): $(grep 'gen 1' spare.out)"
if pgrep -f '^sleep 3011$' >/dev/null || pgrep -f "rendezvousd --job-dir $GPURUN_JOBS/$id " >/dev/null; then
    grs_fail "processes left: $(pgrep -af "sleep 3011|$GPURUN_JOBS/$id ")"
fi
echo "ok - node 1 lost on Slurm: the spare $spare_host took its place, the job completed"
