#!/usr/bin/env bash
# The cuda backend trains like the cpu one: 20 steps of the tests' small model (with a
# validation at steps 10 and 20) on one rank, cpu against cuda in fp32 (the same maths in
# another order of additions: every loss and validation loss within 1e-4 relative) and cuda in
# bf16 (bf16 parameters and activations: within 1e-2 relative, and learning; the same bits
# with train.cuda_graphs off as on). Gradient
# accumulation (batch 1 x grad_accum 2) trains on the same batches as batch 2 (fp32, 1e-4).
# The cuda run writes the same metrics.jsonl keys and prints the same lines, its run line
# naming the device and NCCL, and samples text at the end. Then the model of jobs/tiny.cfg
# (one rank of it), 20 steps: fp32 within 1e-4 again, at a learning rate of 1e-3; bf16 tracks
# cpu (the median step within 1e-2, validation within 5e-2: the job's own rate of 3e-3 makes a
# loss spike at step 18, from 3.8 to 6.2, that lands on one run and not on the other).
# The fp32 run takes the lower rate because the spike amplifies the order of additions: at
# 3e-3 the largest difference is the spike's step, 2.9e-4 on an H200 and 2.6e-5 under cudasim;
# at 1e-3 (no spike) it is 5.4e-8 under cudasim, as in the runs above, and passed on the H200.
# timeout: 300
# lane: side
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
grep -q "^run: 20 steps, cuda, one GPU per rank, fp32, CUDA graphs: on, nccl" "$work/out" ||
    fail "the run line does not name the device, fp32, graphs and nccl: $(grep '^run:' "$work/out")"
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
grep -q "^run: 20 steps, cuda, one GPU per rank, bf16 (fp32 master weights), attention: .*, CUDA graphs: on, nccl" "$work/out" ||
    fail "the run line does not name bf16: $(grep '^run:' "$work/out")"
curves_close "$work/cpu/metrics.jsonl" "$work/bf16/metrics.jsonl" 1e-2 "cuda bf16 against cpu"
# Without CUDA graphs: the same run, bit for bit (steps 2 to 20 ran as graph launches above).
train_cuda "$cfg" "${twenty[@]}" train.cuda_graphs=off train.out_dir="$work/bf16-nographs"
expect_rc 0 "cuda bf16 without CUDA graphs, 20 steps"
grep -q ", CUDA graphs: off, nccl" "$work/out" ||
    fail "the run line does not say graphs are off: $(grep '^run:' "$work/out")"
same_losses "$work/bf16/metrics.jsonl" "$work/bf16-nographs/metrics.jsonl" \
    "cuda bf16 with and without CUDA graphs"
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

# jobs/tiny.cfg's model and optimizer (4 layers, 128 channels, seq 128, batch 4), 20 steps of
# one rank on these tests' data.
root_dir=$(cd "$(dirname "$0")/../.." && pwd)
tiny=("$root_dir/jobs/tiny.cfg" train.steps=20 train.eval_every=10 train.eval_batches=2
    data.train="$data/train_*.bin" data.val="$data/val_*.bin" train.sample_tokens=0)
train "${tiny[@]}" train.out_dir="$work/tiny-cpu"
expect_rc 0 "jobs/tiny.cfg on cpu, 20 steps"
train "${tiny[@]}" optim.lr=1e-3 train.out_dir="$work/tiny-cpu-1e-3"
expect_rc 0 "jobs/tiny.cfg on cpu at lr 1e-3, 20 steps"
train_cuda "${tiny[@]}" optim.lr=1e-3 train.dtype=fp32 train.out_dir="$work/tiny-fp32"
expect_rc 0 "jobs/tiny.cfg on cuda fp32 at lr 1e-3, 20 steps"
curves_close "$work/tiny-cpu-1e-3/metrics.jsonl" "$work/tiny-fp32/metrics.jsonl" 1e-4 \
    "jobs/tiny.cfg at lr 1e-3, cuda fp32 against cpu"
train_cuda "${tiny[@]}" train.out_dir="$work/tiny-bf16"
expect_rc 0 "jobs/tiny.cfg on cuda bf16, 20 steps"
curves_track "$work/tiny-cpu/metrics.jsonl" "$work/tiny-bf16/metrics.jsonl" 1e-2 5e-2 \
    "jobs/tiny.cfg, cuda bf16 against cpu"
