#!/usr/bin/env bash
# The frameworks lane (fw_common.sh): PyTorch Lightning 1.9.5's DDP on CPUs with gpurun's
# memory checkpoints (gpurun.lightning.GpurunMemCheckpoint, one each epoch), 2 ranks on 2
# emulated nodes. Rank 1 is SIGKILLed in the third epoch; gpurun restarts the ranks
# (--max-restarts 1), both resume from their memory copies of the second epoch's end, and the
# job ends with the parameters of an undisturbed run, bit for bit.
# timeout: 600
set -euo pipefail
# shellcheck source=fw_common.sh
. "$(dirname "$0")/fw_common.sh"

fw_need_python
fw_install lightning "${FW_LIGHTNING[@]}" || skip "$fw_why"
export PYTHONPATH=$deps/lightning
job=$root/tests/python/lightning_mem_job.py

# memlane NAME: the job's "memlane" lines, one a rank, by rank.
memlane() {
    sed -nE 's/^\[[0-9]+\] (memlane .*)$/\1/p' "$work/$1-2x1.out" | sort
}

fw_run calm 2x1 -- "$python" "$job" calm "$work/calm"
[ "$rc" = 0 ] || fail "the undisturbed run exited $rc"
calm=$(memlane calm)
[ "$(grep -c 'steps 32 resumed -1 ' <<<"$calm")" = 2 ] ||
    fail "the undisturbed run: not 2 ranks of 32 steps that never resumed: '$calm'"
digest=$(sed -nE 's/.* params ([0-9a-f]+)$/\1/p' <<<"$calm" | sort -u)
[ "$(grep -c . <<<"$digest")" = 1 ] || fail "the undisturbed run's ranks differ: '$calm'"

fw_run hit 2x1 --max-restarts 1 -- "$python" "$job" hit "$work/hit"
[ "$rc" = 0 ] || fail "the run whose rank 1 was killed exited $rc"
grep -q 'rank 1 killed at step 20' "$work/hit-2x1.out" || fail "rank 1 was never killed"
for r in 0 1; do
    grep -q "^\[$r\] gpurun: rank $r resumes from its memory checkpoint 'lightning' of step 16$" \
        "$work/hit-2x1.out" || fail "rank $r did not say it resumes from memory at step 16"
done
hit=$(memlane hit)
while IFS= read -r line; do
    echo "# $line"
done <<<"$hit"
[ "$(grep -c "steps 32 resumed 16 params $digest$" <<<"$hit")" = 2 ] ||
    fail "after the restart: not 2 ranks resumed at step 16 ending with the undisturbed run's parameters $digest: '$hit'"
echo "ok - Lightning resumed from memory at step 16 of 32 with the undisturbed run's parameters"
