#!/usr/bin/env bash
# jobs/tiny.cfg learns: two ranks under `gpurun --local --gpus-per-node 2` on the demo corpus
# (scripts/prep-demo-data.sh), 40 steps: the training loss at step 40 is at most 80% of step
# 1's, the validation loss fell too, and rank 0 ends with a text sample.
# timeout: 240
set -euo pipefail
# shellcheck source=train_common.sh
. "$(dirname "$0")/train_common.sh"

root_dir=$(cd "$(dirname "$0")/../.." && pwd)
[ -r /usr/share/info/coreutils.info.gz ] || skip "no coreutils manual to make the demo corpus from"
BUILD=$build "$root_dir/scripts/prep-demo-data.sh" "$work/demo" >"$work/prep.out" 2>&1 || {
    cat "$work/prep.out"
    fail "scripts/prep-demo-data.sh failed"
}

GPURUN_LIMIT=180 run --local --gpus-per-node 2 "$root_dir/jobs/tiny.cfg" train.steps=40 \
    train.eval_every=20 train.eval_batches=4 train.sample_tokens=100 \
    data.train="$work/demo/train_*.bin" data.val="$work/demo/val_*.bin" train.out_dir="$work/run"
expect_rc 0 "gpurun --local --gpus-per-node 2 jobs/tiny.cfg train.steps=40"
first=$(loss_at "$work/run/metrics.jsonl" 1)
last=$(loss_at "$work/run/metrics.jsonl" 40)
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b <= 0.8 * a) }' ||
    fail "loss $last at step 40 is above 80% of step 1's ($first)"
v20=$(losses "$work/run/metrics.jsonl" | awk '$1 == 20 { print $5 }')
v40=$(losses "$work/run/metrics.jsonl" | awk '$1 == 40 { print $5 }')
if [ -z "$v20" ] || [ -z "$v40" ]; then
    fail "no val_loss at steps 20 and 40"
fi
awk -v a="$v20" -v b="$v40" 'BEGIN { exit !(b < a) }' ||
    fail "val loss did not fall from step 20 ($v20) to 40 ($v40)"
grep -q '^\[0\] sample after step 40 (100 tokens, temperature 0\.8):$' "$work/out" ||
    fail "no sample at the end"
echo "# loss $first -> $last in 40 steps (val $v20 -> $v40)"
