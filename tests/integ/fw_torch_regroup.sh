#!/usr/bin/env bash
# The frameworks lane (fw_common.sh): a user's torch DDP script (gloo, CPU) regrouping in
# process through gpurun.inprocess.run (tests/python/regroup_job.py): a gpurun --local run of 2
# nodes of 1 rank and a spare; past step 150 node 1's rendezvousd is SIGKILLed (its rank dies
# with it). Rank 0's collective fails, it keeps its process, the leader names generation 1
# with the spare in node 1's place, rank 0 re-forms torch's process group with the spare's new
# rank, which takes rank 0's live state, and the run goes on from the last completed step.
# Every later loss and the final parameters and Adam moments equal an undisturbed run's, bit
# for bit.
# timeout: 300
set -euo pipefail
# shellcheck source=fw_common.sh
. "$(dirname "$0")/fw_common.sh"

fw_need_python
job=$root/tests/python/regroup_job.py
steps=600

# losses FILE: rank 0's "STEP VALUE" lines, the last of each step.
losses() {
    sed -nE 's/^\[0\] loss ([0-9]+) (.*)$/\1 \2/p' "$1" | awk '{ v[$1] = $2 } END { for (s in v) print s, v[s] }' |
        sort -n
}

fw_run calm 2x1 -- "$python" "$job" "$steps"
[ "$rc" = 0 ] || fail "the undisturbed run exited $rc"
calm=$(sed -nE "s/^\[[0-9]\] regroup_job rank [01] steps $steps params ([0-9a-f]+)$/\1/p" \
    "$work/calm-2x1.out" | sort -u)
[ "$(grep -c . <<<"$calm")" = 1 ] || fail "the undisturbed run: not one digest of 2 ranks: '$calm'"

timeout -k 5 "$FW_JOB_LIMIT" "$gpurun" --local --nodes 2 --gpus-per-node 1 --spare-nodes 1 \
    --max-restarts 1 --kill-grace 1 --log-level info --job-dir "$work/hit" -- \
    "$python" "$job" "$steps" >"$work/hit.out" 2>"$work/hit.err" </dev/null &
pid=$!
bg_pids+=("$pid")
fail_show=(hit.out hit.err)
for _ in $(seq 1200); do
    grep -q '^\[0\] loss 150 ' "$work/hit.out" 2>/dev/null && break
    sleep 0.05
done
grep -q '^\[0\] loss 150 ' "$work/hit.out" || fail "the run never got past step 150"
victim=$(daemon_pid "$work/hit" 1)
[ -n "$victim" ] || fail "no rendezvousd of node 1"
t0=$(date +%s%N)
kill -KILL "$victim"
again=
for _ in $(seq 2000); do
    if grep -q '^\[0\] start generation 1 ' "$work/hit.out"; then
        again=$((($(date +%s%N) - t0) / 1000000))
        break
    fi
    sleep 0.005
done
rc=0
wait "$pid" || rc=$?
[ "$rc" = 0 ] || fail "the run whose node 1 was lost exited $rc"
grep -q "node 1 lost: the ranks of the other nodes regroup in process with the spare's, as generation 1" \
    "$work/hit.err" || fail "the leader did not regroup in process: $(grep -m3 'lost\|regroup\|restart' "$work/hit.err")"
grep -q '^\[0\] gpurun: rank 0 regrouped in process as generation 1$' "$work/hit.err" ||
    fail "rank 0 did not say it regrouped"

# Rank 0 kept its process: its two calls of the training function, one pid.
starts0=$(sed -nE 's/^\[0\] start generation ([0-9]+) step ([0-9]+) call ([0-9]+) pid ([0-9]+)$/\1 \2 \3 \4/p' \
    "$work/hit.out")
read -r g1 s1 c1 p1 g2 from c2 p2 <<<"$(tr '\n' ' ' <<<"$starts0")" || true
[ "$g1 $s1 $c1 $g2 $c2 $p2" = "0 0 1 1 2 $p1" ] ||
    fail "rank 0 did not go on in its own process as generation 1: '$starts0'"
# The spare's new rank 1 started in generation 1 at the same step.
grep -q "^\[1\] start generation 1 step $from call 1 pid " "$work/hit.out" ||
    fail "the spare's rank 1 did not start in generation 1 at step $from: $(grep '^\[1\] start' "$work/hit.out")"
echo "# rank 0 (pid $p1) regrouped with the spare's rank 1 at step $from"

hit=$(sed -nE "s/^\[[0-9]\] regroup_job rank [01] steps $steps params ([0-9a-f]+)$/\1/p" \
    "$work/hit.out" | sort | uniq -c | awk '{ print $1, $2 }')
[ "$hit" = "2 $calm" ] || fail "the ranks' final digests '$hit', not 2 of the undisturbed run's $calm"
diff <(losses "$work/calm-2x1.out" | awk -v f="$from" '$1 > f') \
    <(losses "$work/hit.out" | awk -v f="$from" '$1 > f') >"$work/diff" || {
    head -n 20 "$work/diff"
    fail "the losses after the regroup differ from the undisturbed run's"
}
[ "$(losses "$work/hit.out" | awk -v f="$from" '$1 > f' | wc -l)" = $((steps - from)) ] ||
    fail "rank 0 did not print a loss for each step after $from"
# The script's own error (rank 1 raises "CUDA out of memory" after step 50) is no peer's loss:
# gpurun.inprocess raises it at once, the job fails with it instead of waiting for a
# generation that never comes (regroup_timeout, 120 s).
t1=$(date +%s%N)
fw_run own 2x1 --spare-nodes 1 --max-restarts 1 --kill-grace 1 -- "$python" "$job" "$steps" -1 50
own_ms=$((($(date +%s%N) - t1) / 1000000))
[ "$rc" != 0 ] || fail "the run whose rank raised its own error exited 0"
grep -q "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB (a test's)" "$work/own-2x1.err" ||
    fail "the rank's own error is not in the job's output"
# (Rank 0 sees its peer gone and waits for a generation, until the teardown answers.)
grep -q "^\[1\] gpurun: rank 1: a collective failed" "$work/own-2x1.err" &&
    fail "gpurun.inprocess took the script's own error for a peer's loss"
[ "$own_ms" -lt 60000 ] || fail "the job took $own_ms ms to fail on the rank's own error"
echo "# the script's own error: raised at once, the job failed in $own_ms ms"
echo "ok - torch DDP regrouped in process at step $from of $steps: parameters, moments and losses bit for bit the undisturbed run's (the kill to rank 0 training again: $again ms)"
