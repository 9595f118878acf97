#!/usr/bin/env bash
# Checkpoints on cuda: a run resumed from its step-5 checkpoint writes the same metrics and
# the same step-10 checkpoint, bit for bit, as the run that went on (bf16, and fp32 with ZeRO-1
# on one rank); and the format is the cpu's: a cpu checkpoint resumes on cuda and a cuda one on
# cpu, each continuing the other's run within the fp32 tolerance of train_cuda_cpu.sh
# (a constant learning rate, so that the schedules of 5 and 10 steps agree).
# timeout: 900
set -euo pipefail
# shellcheck source=train_cuda_common.sh
. "$(dirname "$0")/train_cuda_common.sh"
pick_flavour

small=(train.batch_size=2 train.eval_every=0 data.val=)

# resumed NAME ARGS...: 10 steps with a checkpoint every 5 in $work/NAME, then a copy of its
# step-5 checkpoint resumed to 10 in $work/NAME.r: the same metrics and step-10 state.
resumed() {
    local name=$1 a=$work/$1 b=$work/$1.r s
    shift
    train_cuda "$cfg" "${small[@]}" "$@" train.ckpt_every=5 train.out_dir="$a"
    expect_rc 0 "$name: 10 steps"
    for s in 5 10; do
        [ -f "$a/ckpt_0000000$s.bin" ] || [ -f "$a/ckpt_000000$s.bin" ] ||
            fail "$name: no checkpoint of step $s in '$a': $(ls "$a")"
    done
    mkdir "$b"
    cp "$a/ckpt_00000005.bin" "$a/metrics.jsonl" "$b/"
    train_cuda "$cfg" "${small[@]}" "$@" train.ckpt_every=5 train.out_dir="$b" train.resume=1
    expect_rc 0 "$name: resume from step 5"
    expect_out_line "resuming from '$b/ckpt_00000005.bin' at step 5"
    same_losses "$a/metrics.jsonl" "$b/metrics.jsonl" "$name: steps 6..10 after a resume"
    cmp -s <(state_of "$a/ckpt_00000010.bin") <(state_of "$b/ckpt_00000010.bin") ||
        fail "$name: the step-10 checkpoints' parameters and moments differ"
    ok "$name: the step-10 checkpoints are bit-identical"
}
resumed bf16
resumed "fp32-zero" train.dtype=fp32 train.zero=1

# --- across devices -------------------------------------------------------------------------
flat=("${small[@]}" optim.min_lr=1e-3 optim.warmup_steps=0)
train "$cfg" "${flat[@]}" train.out_dir="$work/cpu10"
expect_rc 0 "cpu, 10 steps"

train "$cfg" "${flat[@]}" train.steps=5 train.out_dir="$work/c2g"
expect_rc 0 "cpu, 5 steps"
train_cuda "$cfg" "${flat[@]}" train.dtype=fp32 train.resume=1 train.out_dir="$work/c2g"
expect_rc 0 "cuda fp32 resuming the cpu run"
expect_out_line "resuming from '$work/c2g/ckpt_00000005.bin' at step 5"
curves_close "$work/cpu10/metrics.jsonl" "$work/c2g/metrics.jsonl" 1e-3 \
    "a cpu checkpoint resumed on cuda against 10 cpu steps"

train_cuda "$cfg" "${flat[@]}" train.dtype=fp32 train.steps=5 train.out_dir="$work/g2c"
expect_rc 0 "cuda fp32, 5 steps"
train "$cfg" "${flat[@]}" train.resume=1 train.out_dir="$work/g2c"
expect_rc 0 "cpu resuming the cuda run"
expect_out_line "resuming from '$work/g2c/ckpt_00000005.bin' at step 5"
curves_close "$work/cpu10/metrics.jsonl" "$work/g2c/metrics.jsonl" 1e-3 \
    "a cuda checkpoint resumed on cpu against 10 cpu steps"

# bf16 master weights are fp32 in the file: a bf16 checkpoint resumes on cpu too.
train "$cfg" "${small[@]}" train.resume=1 train.steps=12 train.out_dir="$work/bf16"
expect_rc 0 "cpu resuming the cuda bf16 run"
expect_out_line "resuming from '$work/bf16/ckpt_00000010.bin' at step 10"
ok "a bf16 checkpoint resumed on cpu: loss $(loss_at "$work/bf16/metrics.jsonl" 12) at step 12"
