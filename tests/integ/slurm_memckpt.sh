#!/bin/bash
# Memory checkpoints across nodes on the Slurm test cluster (gpurun.memckpt; daemon/memlink.c
# between network namespaces): a 2-node job of 1 rank each with a spare; each rank saves its
# state, node 0 holds node 1's copy (its replica crosses the daemons' authenticated link),
# and rank 1 then kills its own node's rendezvousd. At the restart the spare takes node 1's
# place and its daemon fetches rank 1's copy from node 0: both ranks load their states of
# step 11, the log says where from, and gpurun status's "state from" column too. Then a
# transfer cut halfway (the older copy stays), a flood of saves (the store answers, the holder
# ends with the newest) and the cap. (Both copies lost needs 5 nodes; the cluster has 3:
# local_memckpt tests it.)
# timeout: 400
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

# A transfer cut: node 1's daemon killed while rank 1's 256 MiB copy crosses to node 0, which
# keeps the older copy whole; the spare's rank 1 loads that.
rc=0
timeout 150 "$gpurun" --wait -N 2 --gpus-per-node 1 --spare-nodes 1 --kill-grace 1 \
    --log-level info -- "$py" "$job" cut >cut.out 2>cut.err </dev/null || rc=$?
[ "$rc" = 0 ] || grs_fail "the job whose transfer was cut exited $rc: $(tail -n 5 cut.err; tail -n 5 cut.out)"
grep -q "node 0 refused rank 1's memory checkpoint 'state' from its peer: the transfer was cut at byte [0-9]* of 268435463" cut.out cut.err ||
    grs_fail "node 0 does not say the transfer was cut: $(grep -h 'refused\|cut' cut.out cut.err)"
grep -qF "[1] rank 1 generation 1: state step 1, 21 bytes, sha256 $(printf 'first state of rank 1' | sha256sum | cut -c1-16)" cut.out ||
    grs_fail "rank 1 did not load its older copy whole: $(grep '^\[1\]' cut.out | tail -n 3)"
echo "# a transfer cut between the namespaces left node 0 the older copy, whole"

# A flood of saves: 300 of 1 MiB from rank 1 while rank 0 times the job's store across the
# namespaces; node 0 ends with the newest copy.
rc=0
timeout 150 "$gpurun" --wait -N 2 --gpus-per-node 1 -- "$py" "$job" flood >flood.out 2>flood.err \
    </dev/null || rc=$?
[ "$rc" = 0 ] || grs_fail "the job of the flood exited $rc: $(tail -n 5 flood.err; tail -n 5 flood.out)"
grep -q "^\[1\] node 0 holds rank 1's newest copy (step 300)" flood.out ||
    grs_fail "node 0 did not end with rank 1's newest copy: $(grep '^\[1\]' flood.out)"
slowest=$(sed -n 's/^\[0\] store round trips during the flood: [0-9]*, the slowest \([0-9]*\) ms$/\1/p' flood.out)
[ -n "$slowest" ] || grs_fail "rank 0 timed no round trip: $(grep '^\[0\]' flood.out)"
[ "$slowest" -lt 2000 ] || grs_fail "a store round trip took $slowest ms during the flood"
echo "# flood: $(sed -n 's/^\[1\] saved //p' flood.out); rank 0's store round trips: slowest $slowest ms"

# The cap: a save over --mem-ckpt-max is refused with the sizes, the older copy stays.
rc=0
timeout 100 "$gpurun" --wait -N 1 --gpus-per-node 1 --mem-ckpt-max 1 -- "$py" "$job" cap \
    >cap.out 2>cap.err </dev/null || rc=$?
[ "$rc" = 0 ] || grs_fail "the job over the cap exited $rc: $(tail -n 5 cap.err)"
grep -qF "refused: mem_save 'small': rank 0's memory checkpoint 'small' (2097159 bytes) does not fit --mem-ckpt-max 1048576 bytes beside the 0 kept; the older copy stays" cap.out ||
    grs_fail "the save over the cap was not refused as it should be: $(grep refused cap.out)"
grep -qF "kept step 1, 100 bytes" cap.out || grs_fail "the older copy did not stay: $(cat cap.out)"
echo "ok - memory checkpoints on Slurm: outlived a node, a cut transfer, a flood and the cap"
