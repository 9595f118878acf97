#!/usr/bin/env bash
# The cuda backend trains like the cpu one: 20 steps of the tests' small model (with a
# validation at steps 10 and 20) on one rank, cpu against cuda in fp32 (the same maths in
# another order of additions: every loss and validation loss within 1e-4 relative) and cuda in
# bf16 (bf16 parameters and activations: within 1e-2 relative, and learning). Gradient
# accumulation (batch 1 x grad_accum 2) trains on the same batches as batch 2 (fp32, 1e-4).
# The cuda run writes the same metrics.jsonl keys and prints the same lines, its run line
# naming the device and NCCL, and samples text at the end.
# timeout: 300
set -euo pipefail
# shellcheck source=train_cuda_common.sh
. "$(dirname "$0")/train_cuda_common.sh"
pick_flavour

twenty=(train.steps=20 train.eval_every=10 train.eval_batches=2 train.batch_size=2)

train "$cfg" "${twenty[@]}" train.out_dir="$work/cpu"
expect_rc 0 "cpu, 20 steps"

train_cuda "$cfg" "${twenty[@]}" train.dtype=fp32 train.sample_tokens=16 \
    train.out_dir="$work/fp32"
expect_rc 0 "cuda fp32, 20 steps"
grep -q "^run: 20 steps, cuda device 0 per rank, fp32, nccl" "$work/out" ||
    fail "the run line does not name the device, fp32 and nccl: $(grep '^run:' "$work/out")"
grep -q '^sample after step 20 (16 tokens, temperature 0\.8):$' "$work/out" ||
    fail "no sample at the end of the cuda run"
grep -q '^step 20/20 | loss [0-9.]* | val [0-9.]* | lr ' "$work/out" ||
    fail "no progress line with the validation loss for step 20"
# The same keys, in the same order, on every line.
diff <(sed 's/: [^,}]*//g' "$work/cpu/metrics.jsonl") \
    <(sed 's/: [^,}]*//g' "$work/fp32/metrics.jsonl") >"$work/diff" || {
    cat "$work/diff"
    fail "metrics.jsonl keys differ between cpu and cuda"
}
curves_close "$work/cpu/metrics.jsonl" "$work/fp32/metrics.jsonl" 1e-4 "cuda fp32 against cpu"

train_cuda "$cfg" "${twenty[@]}" train.out_dir="$work/bf16"
expect_rc 0 "cuda bf16, 20 steps"
grep -q "^run: 20 steps, cuda device 0 per rank, bf16 (fp32 master weights), nccl" "$work/out" ||
    fail "the run line does not name bf16: $(grep '^run:' "$work/out")"
curves_close "$work/cpu/metrics.jsonl" "$work/bf16/metrics.jsonl" 1e-2 "cuda bf16 against cpu"
first=$(loss_at "$work/bf16/metrics.jsonl" 1)
last=$(loss_at "$work/bf16/metrics.jsonl" 20)
cpu_last=$(loss_at "$work/cpu/metrics.jsonl" 20)
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < 0.97 * a) }' ||
    fail "cuda bf16 did not learn: loss $first at step 1, $last at step 20"
ok "bf16 loss $first -> $last in 20 steps (cpu: $(loss_at "$work/cpu/metrics.jsonl" 1) -> $cpu_last)"

# (Without validation: its batches are batch_size sequences, fewer here.)
train_cuda "$cfg" "${twenty[@]}" train.dtype=fp32 train.batch_size=1 train.grad_accum=2 \
    data.val= train.out_dir="$work/accum"
expect_rc 0 "cuda fp32, batch 1 x grad_accum 2"
curves_close "$work/cpu/metrics.jsonl" "$work/accum/metrics.jsonl" 1e-4 \
    "cuda fp32 batch 1 x grad_accum 2 against cpu batch 2"
