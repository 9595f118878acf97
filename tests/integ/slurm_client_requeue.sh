#!/bin/bash
# Requeue on the Slurm test cluster, as submitit does it. First a chain: a job with
# --max-requeues 1 whose ranks checkpoint on the pre-timeout signal (sent to the batch shell
# as Slurm's --signal=B:USR1 does) is requeued by its own script with its id and job dir; the
# ranks resume from their checkpoints, and at the second signal, with no requeue left, the job
# ends COMPLETED. Then preemption: a --requeue job in partition "spot" (PreemptMode=REQUEUE)
# gives its node up to a job of partition "urgent", starts again in the same job dir and
# completes. gpurun --wait follows both through their requeues; status shows each segment's
# end, and every rank log marks where the requeued ranks begin.
# timeout: 300
# lane: side
set -euo pipefail
# shellcheck source=slurm_client_common.sh
. "$(dirname "$0")/slurm_client_common.sh"

rank=$(cd "$here/../.." && pwd)/tests/ranks/preempt_rank.py

# wait_lines FILE REGEX N: waits (up to 60 s) until N lines of FILE match REGEX.
wait_lines() {
    local i
    for ((i = 0; i < 300; i++)); do
        [ "$(grep -csE "$2" "$1" || true)" -ge "$3" ] 2>/dev/null && return 0
        sleep 0.2
    done
    grs_fail "$1 has not $3 lines of '$2' after 60 s: $(tail -n 20 "$1")
$(scontrol show job -o)"
}



# --- the chain: checkpoint at the time limit, requeue, resume ----------------------------
t0=$(grs_now_ms)
rc=0
timeout 200 "$gpurun" --wait -N 1 --gpus-per-node 2 --max-requeues 1 -J chain -- \
    "$py" "$rank" resume 100000 >a.out 2>a.err </dev/null &
pid=$!
wait_lines a.out '^\[[01]\] rank [01] resume up$' 2
id=$(job_id a.out)
[ -n "$id" ] || grs_fail "no job id in: $(head -n 3 a.out)"
sleep 1
scancel --batch --signal=USR1 "$id"
release "$id"
wait_lines a.out '^\[[01]\] rank [01] resume up$' 4
scancel --batch --signal=USR1 "$id"
wait "$pid" || rc=$?
echo "# chain: exit $rc after $(($(grs_now_ms) - t0)) ms"
[ "$rc" = 0 ] || grs_fail "the chain exited $rc: $(tail -n 20 a.out; cat a.err)"
grep -q "requeue 1 of 1" a.out || grs_fail "the script did not say it requeued: $(cat a.out)"
[ "$(job_field "$id" JobState)" = COMPLETED ] || grs_fail "chain job: $(scontrol show job -o "$id")"
[ "$(job_field "$id" Restarts)" = 1 ] || grs_fail "chain job requeued $(job_field "$id" Restarts) times"
dir=$GPURUN_JOBS/$id
for r in 0 1; do
    # Segment 1 went on from segment 0's checkpoint, and wrote the next.
    first=$(sed -n "s/^\[$r\] rank $r: checkpoint at step \([0-9]*\), exiting$/\1/p" a.out | head -n 1)
    [ -n "$first" ] || grs_fail "rank $r checkpointed nothing in segment 0: $(cat a.out)"
    grep -qxF "[$r] rank $r resumed at step $((first + 1))" a.out ||
        grs_fail "rank $r did not resume at step $((first + 1)): $(grep "rank $r" a.out)"
    grep -q "^step " "$dir/ckpt-$r" || grs_fail "no checkpoint of rank $r in $dir"
    grep -q "^----- gpurun: .*: requeue 1, the job starts again -----$" "$dir/logs/rank-$r.log" ||
        grs_fail "rank $r's log marks no requeue: $(cat "$dir/logs/rank-$r.log")"
    # The log has both segments, in order.
    [ "$(grep -c "rank $r resume up" "$dir/logs/rank-$r.log")" = 2 ] ||
        grs_fail "rank $r's log lacks a segment: $(cat "$dir/logs/rank-$r.log")"
done
[ -f "$dir/segments/0.json" ] || grs_fail "segment 0's summary was not kept: $(ls "$dir")"
[ "$(json "$dir/summary.json" 'v["requeues"], v["exit_status"], v["segments"][0]["exit_status"]')" = "(1, 0, 0)" ] ||
    grs_fail "summary: $(json "$dir/summary.json" 'v.get("requeues"), v.get("segments")')"
# A dir set aside is named ID.YYYYmmdd-HHMMSS.
! compgen -G "$GPURUN_JOBS/$id.[0-9]*" >/dev/null || grs_fail "the job dir was set aside: $(ls "$GPURUN_JOBS")"
run st.txt st.err status "$id"
expect_rc "gpurun status" 0
grep -qx "requeues: 1" st.txt || grs_fail "status shows no requeue: $(cat st.txt)"
grep -qx "  segment 0 ended: the ranks checkpointed on the pre-timeout signal 10 and ended" st.txt ||
    grs_fail "status does not say how segment 0 ended: $(cat st.txt)"

# --- preemption: a spot job gives its node to an urgent one and starts again ------------
rc=0
timeout 200 "$gpurun" --wait -N 1 --gpus-per-node 2 -p spot --requeue -J spot -- \
    "$py" "$rank" resume 40 >b.out 2>b.err </dev/null &
pid=$!
wait_lines b.out '^\[[01]\] rank [01] resume up$' 2
id=$(job_id b.out)
node=$(job_field "$id" NodeList)
urgent=$(sbatch --parsable -p urgent -w "$node" --exclusive -t 1 -o /dev/null --wrap 'sleep 2') ||
    grs_fail "sbatch of the urgent job failed"
release "$id"
wait "$pid" || rc=$?
[ "$rc" = 0 ] || grs_fail "the preempted job exited $rc: $(tail -n 20 b.out; cat b.err)"
[ "$(job_field "$id" JobState)" = COMPLETED ] || grs_fail "spot job: $(scontrol show job -o "$id")"
[ "$(job_field "$id" Restarts)" = 1 ] || grs_fail "spot job requeued $(job_field "$id" Restarts) times"
state=$(grs_job_wait "$urgent" 60) || grs_fail "the urgent job did not end"
[ "$state" = COMPLETED ] || grs_fail "the urgent job is $state"
dir=$GPURUN_JOBS/$id
for r in 0 1; do
    grep -qxF "[$r] rank $r done at step 40" b.out || grs_fail "rank $r did not finish: $(cat b.out)"
    grep -q "^----- gpurun: .*: requeue 1, the job starts again -----$" "$dir/logs/rank-$r.log" ||
        grs_fail "rank $r's log marks no requeue: $(cat "$dir/logs/rank-$r.log")"
done
run st.txt st.err status "$id"
grep -qx "requeues: 1" st.txt || grs_fail "status shows no requeue: $(cat st.txt)"
grep -qE "^  segment 0 ended: (stopped by Slurm \(preempted\)|no summary)" st.txt ||
    grs_fail "status does not say how segment 0 ended: $(cat st.txt)"
echo "# $(grep 'segment 0 ended' st.txt)"
sed 's/^/# /' st.txt
