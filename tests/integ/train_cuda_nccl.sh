#!/usr/bin/env bash
# Data parallel on cuda over NCCL, 2 ranks under gpurun --local (both see both devices and pick
# theirs by LOCAL_RANK, or one each under --gpu-bind=single; under cudasim two emulated
# devices): 2 ranks x batch 2 train on the same global batches as 1 rank x
# batch 4, so their losses agree within 1e-3 relative (fp32; the sums' order differs), with
# the gradients averaged by an allreduce (zero 0) or reduce-scattered into ZeRO-1 shards
# whose updates are all-gathered (zero 1), which agree with each other within 1e-5, in fp32
# and in bf16. A ZeRO-1 checkpoint (the shards gathered on rank 0) resumes on 2 ranks bit for
# bit and on 1 rank without ZeRO within the fp32 tolerance.
# timeout: 300
set -euo pipefail
# shellcheck source=train_cuda_common.sh
. "$(dirname "$0")/train_cuda_common.sh"
pick_flavour
if [ "$flavour" = cuda ] && [ "$gpus" -lt 2 ]; then
    skip "2 ranks need 2 GPUs; nvidia-smi lists $gpus"
fi
if [ "$flavour" = cudasim ]; then
    # Two emulated devices, as on a GPU node.
    export CUDASIM_DEVICES=2
fi
GPURUN_LIMIT=$CUDA_LIMIT

six=(train.steps=6 train.eval_every=0 data.val= train.ckpt_every=3)

# run2 ARGS...: 2 ranks of the flavour's gpurun-train ARGS train.device=cuda.
run2() {
    run --local --gpus-per-node 2 -- "$cuda_bin" "$cfg" "$@" train.device=cuda
}

train_cuda "$cfg" "${six[@]}" train.dtype=fp32 train.batch_size=4 train.out_dir="$work/one"
expect_rc 0 "1 rank x batch 4"

for z in 0 1; do
    run2 "${six[@]}" train.dtype=fp32 train.batch_size=2 train.zero=$z train.out_dir="$work/z$z"
    expect_rc 0 "2 ranks x batch 2, zero $z"
    grep -q '^\[0\] run: .*, nccl: 2 ranks' "$work/out" ||
        fail "zero $z: the run line does not show NCCL over 2 ranks: $(grep '^\[0\] run:' "$work/out")"
    grep -q '^\[1\] ' "$work/out" && fail "rank 1 printed lines: $(grep '^\[1\] ' "$work/out" | head -n 3)"
    curves_close "$work/one/metrics.jsonl" "$work/z$z/metrics.jsonl" 1e-3 \
        "fp32, 2 ranks x batch 2 (zero $z) against 1 rank x batch 4"
done
grep -q '^\[0\] run: .*ZeRO-1 (optimizer shard of ' "$work/out" ||
    fail "zero 1: the run line does not show the shard"
curves_close "$work/z0/metrics.jsonl" "$work/z1/metrics.jsonl" 1e-5 "fp32, zero 1 against zero 0"

# --gpu-bind=single: each rank sees only its own device (device 0 of its CUDA_VISIBLE_DEVICES)
# where by default both see both and pick theirs by LOCAL_RANK; the training is the same.
run --local --gpus-per-node 2 --gpu-bind=single -- "$cuda_bin" "$cfg" "${six[@]}" train.device=cuda \
    train.dtype=fp32 train.batch_size=2 train.zero=0 train.out_dir="$work/single"
expect_rc 0 "2 ranks x batch 2 under --gpu-bind=single"
curves_close "$work/z0/metrics.jsonl" "$work/single/metrics.jsonl" 1e-5 \
    "fp32, --gpu-bind=single against the default"

for z in 0 1; do
    run2 "${six[@]}" train.batch_size=2 train.zero=$z train.out_dir="$work/b$z"
    expect_rc 0 "bf16, 2 ranks, zero $z"
done
curves_close "$work/b0/metrics.jsonl" "$work/b1/metrics.jsonl" 1e-5 "bf16, zero 1 against zero 0"

# The ZeRO-1 checkpoint of step 3, resumed on 2 ranks and on 1.
mkdir "$work/z1.r" "$work/z1.one"
cp "$work/z1/ckpt_00000003.bin" "$work/z1/metrics.jsonl" "$work/z1.r/"
cp "$work/z1/ckpt_00000003.bin" "$work/z1/metrics.jsonl" "$work/z1.one/"
run2 "${six[@]}" train.dtype=fp32 train.batch_size=2 train.zero=1 train.resume=1 \
    train.out_dir="$work/z1.r"
expect_rc 0 "2 ranks, zero 1, resumed from step 3"
expect_out_line "[0] resuming from '$work/z1.r/ckpt_00000003.bin' at step 3"
same_losses "$work/z1/metrics.jsonl" "$work/z1.r/metrics.jsonl" "zero 1 on 2 ranks, resumed"
cmp -s <(state_of "$work/z1/ckpt_00000006.bin") <(state_of "$work/z1.r/ckpt_00000006.bin") ||
    fail "zero 1 on 2 ranks: the step-6 checkpoints' parameters and moments differ after a resume"
train_cuda "$cfg" "${six[@]}" train.dtype=fp32 train.batch_size=4 train.resume=1 \
    train.out_dir="$work/z1.one"
expect_rc 0 "1 rank, zero 0, resuming the 2-rank zero 1 run"
curves_close "$work/one/metrics.jsonl" "$work/z1.one/metrics.jsonl" 1e-3 \
    "a 2-rank ZeRO-1 checkpoint resumed on 1 rank against 1 rank throughout"
