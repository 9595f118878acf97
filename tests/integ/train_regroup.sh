#!/usr/bin/env bash
# gpurun-train regrouping in process (train.regroup, gr_regroup): a gpurun --local run of 2
# nodes of 1 rank and a spare; past step 300 node 1's rendezvousd is SIGKILLed (its rank dies
# with it). Rank 0 keeps its process: it waits, the leader names generation 1 with the spare
# in node 1's place, rank 0 re-forms its collectives with the spare's new rank, which takes
# rank 0's state, and the run goes on from the last completed step (at most the step in
# flight lost). Every step's loss equals an undisturbed run's, bit for bit, and so do the
# final checkpoint's parameters and moments.
# timeout: 180
set -euo pipefail
# shellcheck source=train_common.sh
. "$(dirname "$0")/train_common.sh"

cd "$work"
steps=1500
args=(small.cfg "train.steps=$steps" train.eval_every=0 train.ckpt_every=0 train.log_every=1)

run --local -N 2 --gpus-per-node 1 -- "$train_bin" "${args[@]}" train.out_dir=ref
expect_rc 0 "the undisturbed run"

timeout -k 5 "$GPURUN_LIMIT" "$gpurun" --local -N 2 --gpus-per-node 1 --spare-nodes 1 \
    --max-restarts 1 --kill-grace 1 --log-level info --job-dir "$work/job" -- \
    "$train_bin" "${args[@]}" train.out_dir=hit >"$work/out" 2>"$work/err" </dev/null &
pid=$!
bg_pids+=("$pid")
rank0=
for _ in $(seq 600); do
    if [ -s hit/metrics.jsonl ] && [ "$(wc -l <hit/metrics.jsonl)" -ge 300 ]; then
        for p in $(pgrep -f -- "$train_bin ${args[*]} train.out_dir=hit" || true); do
            if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx RANK=0; then
                rank0=$p
            fi
        done
        [ -n "$rank0" ] && break
    fi
    sleep 0.05
done
[ -n "$rank0" ] || fail "the run never got past step 300: $(tail -n 3 "$work/out")"
victim=$(daemon_pid "$work/job" 1)
[ -n "$victim" ] || fail "no rendezvousd of node 1"
kill -KILL "$victim"
rc=0
wait "$pid" || rc=$?
expect_rc 0 "the run whose node 1 was lost"
grep -q "node 1 lost: the ranks of the other nodes regroup in process with the spare's, as generation 1" "$work/err" ||
    fail "the leader did not regroup in process: $(grep -m3 'lost\|regroup\|restart' "$work/err")"
# Rank 0's process is the one that started: it set up once and says it regrouped.
[ "$(grep -c '^\[0\] model: GPT-2' "$work/out")" = 1 ] ||
    fail "rank 0 started more than once: $(grep '^\[0\] model: GPT-2' "$work/out")"
lost_after=$(sed -n 's/^\[0\] a peer was lost after step \([0-9]*\): .*/\1/p' "$work/out")
from=$(sed -n 's/^\[0\] regrouped in process as generation 1: going on from step \([0-9]*\) (the live state of rank 0)$/\1/p' "$work/out")
if [ -z "$lost_after" ] || [ -z "$from" ]; then
    fail "rank 0 did not say it regrouped: $(grep -m3 '^\[0\] \(a peer\|regroup\)' "$work/out")"
fi
last=$(sed -n 's/^\[0\] step *\([0-9]*\)\/.*/\1/p' "$work/out" | awk -v f="$from" '$1 <= f + 0 { n = $1 } END { print n + 0 }')
echo "# rank 0 (pid $rank0) lost its peer after step $lost_after, went on from step $from (the last step printed before: $last)"
[ "$from" -ge "$lost_after" ] || fail "went on from step $from, before step $lost_after"
# The steps after the regroup: the undisturbed run's losses, bit for bit. A step rank 0 had
# completed when its peer was lost has no line of its own (its loss was never agreed).
diff <(losses ref/metrics.jsonl | awk -v f="$from" '$1 > f') \
    <(losses hit/metrics.jsonl | awk -v f="$from" '$1 > f') >"$work/diff" || {
    head -n 20 "$work/diff"
    fail "the losses after the regroup differ from the undisturbed run's"
}
final=$(printf 'ckpt_%08d.bin' "$steps")
cmp -s <(state_of "ref/$final") <(state_of "hit/$final") ||
    fail "the step-$steps checkpoints' parameters and moments differ"
echo "# node 1 lost past step 300: rank 0 kept running, regrouped with the spare from step $from; bit-identical to the undisturbed run"
