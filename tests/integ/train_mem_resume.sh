#!/usr/bin/env bash
# gpurun-train's memory checkpoints (train.mem_ckpt_every): a 2-node gpurun --local run with
# no disk checkpoint but the last has rank 1 SIGKILLed past step 12 (wherever the poll finds
# it); the restarted generation resumes from rank 0's newest memory checkpoint, of step 10 or
# later (the log and the trainer say so), and the run ends equal to an undisturbed one bit for
# bit: every loss, and the parameters and moments of the last checkpoint.
# timeout: 180
set -euo pipefail
# shellcheck source=train_common.sh
. "$(dirname "$0")/train_common.sh"

cd "$work"
steps=3000
args=(small.cfg "train.steps=$steps" train.eval_every=0 train.ckpt_every=0 train.mem_ckpt_every=5)

run --local -N 2 --gpus-per-node 1 -- "$train_bin" "${args[@]}" train.out_dir=ref
expect_rc 0 "the undisturbed run"
grep -q "^\[0\] memory checkpoint of step 5 (.* MB in .* ms), every 5 steps$" "$work/out" ||
    fail "rank 0 did not say it keeps memory checkpoints: $(grep -m3 '^\[0\]' "$work/out")"

# Rank 1 is killed once rank 0's metrics are past step 12 (its memory checkpoint of step 10
# is kept); the next generation resumes from it. --restart-on all: rank 0 may fail first, in
# the allreduce its peer left, which alone would class as the job's own error.
timeout -k 5 "$GPURUN_LIMIT" "$gpurun" --local -N 2 --gpus-per-node 1 --max-restarts 1 --restart-on all \
    --kill-grace 1 --log-level info --job-dir "$work/job" -- \
    "$train_bin" "${args[@]}" train.out_dir=killed >"$work/out" 2>"$work/err" </dev/null &
pid=$!
bg_pids+=("$pid")
victim=
for _ in $(seq 600); do
    if [ -s killed/metrics.jsonl ] && [ "$(wc -l <killed/metrics.jsonl)" -ge 13 ]; then
        for p in $(pgrep -f -- "$train_bin ${args[*]} train.out_dir=killed" || true); do
            if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx RANK=1; then
                victim=$p
            fi
        done
        [ -n "$victim" ] && break
    fi
    sleep 0.05
done
[ -n "$victim" ] || fail "rank 1 never got past step 12: $(tail -n 3 "$work/out")"
kill -KILL "$victim"
rc=0
wait "$pid" || rc=$?
expect_rc 0 "the run whose rank 1 was killed"
at=$(sed -n 's/^\[0\] resuming from the memory checkpoint of step \([0-9]*\) at step [0-9]*$/\1/p' "$work/out")
[ -n "$at" ] || fail "generation 1 did not resume from memory: $(grep -m3 'resuming\|no checkpoint' "$work/out")"
if [ $((at % 5)) != 0 ] || [ "$at" -lt 10 ]; then
    fail "resumed from step $at, expected a multiple of 5 from 10"
fi
grep -q "rank 0 takes its memory checkpoint 'ckpt' of step $at (.* bytes) from node 0's memory" "$work/err" ||
    fail "the log does not say where rank 0's state came from"
diff <(losses ref/metrics.jsonl) <(losses killed/metrics.jsonl) >"$work/diff" || {
    head -n 20 "$work/diff"
    fail "the resumed run's losses differ from the undisturbed run's"
}
final=$(printf 'ckpt_%08d.bin' "$steps")
cmp -s <(state_of "ref/$final") <(state_of "killed/$final") ||
    fail "the step-$steps checkpoints' parameters and moments differ"
echo "# rank 1 killed past step 12; resumed from the memory checkpoint of step $at; bit-identical to the undisturbed run"
