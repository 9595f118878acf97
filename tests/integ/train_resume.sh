#!/usr/bin/env bash
# Checkpoints and resume: a run continued from a checkpoint writes the same losses, bit for
# bit, as the run that went on without stopping. One rank: 10 steps against a copy of their
# step-5 checkpoint resumed to 10 (the metrics lines the stopped run wrote past its
# checkpoint are dropped). Two ranks under gpurun --local: 5 steps, then train.steps=10 with
# train.resume=1, against 10 steps at once (a constant learning rate, so that the two
# schedules agree), rank 0 loading the checkpoint and handing it to rank 1.
# timeout: 240
set -euo pipefail
# shellcheck source=train_common.sh
. "$(dirname "$0")/train_common.sh"

seq10="1 2 3 4 5 6 7 8 9 10"

# --- one rank ---------------------------------------------------------------------------------
train "$cfg" train.ckpt_every=5 train.out_dir="$work/a"
expect_rc 0 "10 steps with ckpt_every=5"
for s in 5 10; do
    [ -f "$work/a/ckpt_0000000$s.bin" ] || [ -f "$work/a/ckpt_000000$s.bin" ] ||
        fail "no checkpoint of step $s in '$work/a': $(ls "$work/a")"
done
[ "$(steps_of "$work/a/metrics.jsonl")" = "$seq10" ] ||
    fail "metrics.jsonl of 10 steps holds steps $(steps_of "$work/a/metrics.jsonl")"

mkdir "$work/b"
cp "$work/a/ckpt_00000005.bin" "$work/a/metrics.jsonl" "$work/b/"
train "$cfg" train.ckpt_every=5 train.out_dir="$work/b" train.resume=1
expect_rc 0 "resume from step 5"
expect_out_line "resuming from '$work/b/ckpt_00000005.bin' at step 5"
grep -q '^step  6/10 ' "$work/out" || fail "the resumed run did not go on with step 6"
[ "$(steps_of "$work/b/metrics.jsonl")" = "$seq10" ] ||
    fail "metrics.jsonl after the resume holds steps $(steps_of "$work/b/metrics.jsonl")"
diff <(losses "$work/a/metrics.jsonl") <(losses "$work/b/metrics.jsonl") >"$work/diff" || {
    cat "$work/diff"
    fail "the resumed run's losses differ from the uninterrupted run's"
}
cmp -s <(state_of "$work/a/ckpt_00000010.bin") <(state_of "$work/b/ckpt_00000010.bin") ||
    fail "the step-10 checkpoints' parameters and moments differ"
echo "# one rank: steps 6..10 after a resume are bit-identical"

# Resuming a run that is complete does nothing.
train "$cfg" train.out_dir="$work/b" train.resume=1
expect_rc 0 "resume at the last step"
expect_out_line "nothing to do: the run is at step 10 of 10"

# Started again without train.resume (auto), it resumes too and removes nothing
# (train_rerun.sh has the rest of what a re-run does).
train "$cfg" train.out_dir="$work/b" train.steps=3
expect_rc 0 "a re-run in a used out_dir"
expect_out_line "nothing to do: the run is at step 10 of 3"
[ "$(cd "$work/b" && echo ckpt_*.bin)" = "ckpt_00000005.bin ckpt_00000010.bin" ] ||
    fail "a re-run's out_dir holds $(ls "$work/b")"

# --- two ranks --------------------------------------------------------------------------------
flat=(optim.min_lr=1e-3 optim.warmup_steps=0 train.batch_size=2)
run --local --gpus-per-node 2 "$cfg" "${flat[@]}" train.out_dir="$work/c"
expect_rc 0 "2 ranks, 10 steps"
run --local --gpus-per-node 2 "$cfg" "${flat[@]}" train.out_dir="$work/d" train.steps=5
expect_rc 0 "2 ranks, 5 steps"
[ -f "$work/d/ckpt_00000005.bin" ] || fail "no checkpoint after 5 steps: $(ls "$work/d")"
run --local --gpus-per-node 2 "$cfg" "${flat[@]}" train.out_dir="$work/d" train.resume=1
expect_rc 0 "2 ranks, resumed to 10 steps"
expect_out_line "[0] resuming from '$work/d/ckpt_00000005.bin' at step 5"
[ "$(steps_of "$work/d/metrics.jsonl")" = "$seq10" ] ||
    fail "metrics.jsonl after the resume holds steps $(steps_of "$work/d/metrics.jsonl")"
diff <(losses "$work/c/metrics.jsonl") <(losses "$work/d/metrics.jsonl") >"$work/diff" || {
    cat "$work/diff"
    fail "2 ranks: 5 steps + resume to 10 differ from 10 steps"
}
echo "# two ranks: 5 steps + resume to 10 are bit-identical to 10 steps"
