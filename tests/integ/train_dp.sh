#!/usr/bin/env bash
# Data parallel: the global batch of a step is the same sequences whatever the number of
# ranks, and the gradients are averaged over the ranks, so 1 rank x batch 4, 2 ranks x batch
# 2 (gpurun --local), 1 rank x batch 2 x grad_accum 2 and 2 nodes x 2 ranks x batch 1 write
# the same loss after 6 steps, within 1e-4 relative (the sums' order differs). The ranks come
# from the train.cfg's [job] keys, which gpurun's flags override.
# timeout: 240
set -euo pipefail
# shellcheck source=train_common.sh
. "$(dirname "$0")/train_common.sh"

six=(train.steps=6 train.eval_every=0 data.val=)

# within A B: |A - B| <= 1e-4 |A|
within() {
    awk -v a="$1" -v b="$2" 'BEGIN { d = a - b; if (d < 0) d = -d; m = a < 0 ? -a : a;
        exit !(d <= 1e-4 * m) }'
}

# --gpus-per-node overrides the file's [job] gpus_per_node (2).
run --local --gpus-per-node 1 "$cfg" "${six[@]}" train.batch_size=4 train.out_dir="$work/w1"
expect_rc 0 "1 rank x batch 4"
grep -q '^\[0\] run: .*single: one rank' "$work/out" || fail "--gpus-per-node 1 did not make one rank"
ref=$(loss_at "$work/w1/metrics.jsonl" 6)

check_run() {
    local name=$1 dir=$2 got
    expect_rc 0 "$name"
    got=$(loss_at "$dir/metrics.jsonl" 6)
    within "$ref" "$got" || fail "$name: loss $got after 6 steps, 1 rank x batch 4 gave $ref"
    echo "# $name: loss $got after 6 steps (1 rank x batch 4: $ref)"
}

# The file's [job] gpus_per_node: 2 ranks.
run --local "$cfg" "${six[@]}" train.batch_size=2 train.out_dir="$work/w2"
check_run "2 ranks x batch 2" "$work/w2"
grep -q '^\[0\] run: .*tcp ring of 2 ranks' "$work/out" || fail "2 ranks did not train over the tcp ring"
grep -q '^\[1\] ' "$work/out" && fail "rank 1 printed lines: $(grep '^\[1\] ' "$work/out" | head -n 3)"

train "$cfg" "${six[@]}" train.batch_size=2 train.grad_accum=2 train.out_dir="$work/acc"
check_run "1 rank x batch 2 x grad_accum 2" "$work/acc"

# [job] keys set on the command line: two local nodes of two ranks; every link over TCP.
run --local --export GPURUN_COLL_SHM=0 "$cfg" "${six[@]}" job.nodes=2 job.gpus_per_node=2 \
    train.batch_size=1 train.out_dir="$work/w4"
check_run "2 nodes x 2 ranks x batch 1" "$work/w4"
grep -q '^\[0\] run: .*tcp ring of 4 ranks: to rank 1 ([^)]*) over tcp' "$work/out" ||
    fail "job.nodes=2 with GPURUN_COLL_SHM=0 did not make a ring of 4 over tcp: $(grep '^\[0\] run:' "$work/out")"

# The validation set's batches, W x B sequences each, are counted in the setup line, and an
# evaluation of more of them than the set holds is said to repeat some.
run --local "$cfg" train.steps=1 train.eval_every=1 train.eval_batches=100000 train.batch_size=2 \
    train.out_dir="$work/val"
expect_rc 0 "2 ranks x batch 2 with 100000 eval batches"
vline=$(grep '^\[0\] data: ' "$work/out") || fail "no data line"
vtokens=$(sed -n 's/.* \([0-9]*\) validation tokens .*/\1/p' <<<"$vline")
[ -n "$vtokens" ] || fail "the data line names no validation tokens: $vline"
# S sequences of seq_len 32 (+1 target), over W x B = 4 per batch.
want=$(((vtokens - 1) / 32 / 4))
grep -qF "$vtokens validation tokens ($want batches: train.eval_batches 100000 repeats some)" \
    <<<"$vline" || fail "expected $want batches, repeated: $vline"
run --local "$cfg" train.steps=1 train.eval_every=1 train.eval_batches=2 train.batch_size=2 \
    train.out_dir="$work/val2"
expect_rc 0 "2 ranks x batch 2 with 2 eval batches"
grep -qF "$vtokens validation tokens ($want batches); " "$work/out" ||
    fail "2 eval batches of $want: $(grep '^\[0\] data: ' "$work/out")"
echo "# $vtokens validation tokens: $want batches of 2 ranks x batch 2"

# Every step on the way, not only the sixth.
for d in w2 acc w4; do
    for s in 1 2 3 4 5; do
        within "$(loss_at "$work/w1/metrics.jsonl" $s)" "$(loss_at "$work/$d/metrics.jsonl" $s)" ||
            fail "$d: the loss of step $s differs from 1 rank x batch 4's"
    done
done

# train.coll_timeout_s: a rank stopped (SIGSTOP) mid-run fails its peer's collective once the
# timeout passes, naming the silent rank, and the job fails rather than waiting the default
# 600 s.
timeout -k 5 "$GPURUN_LIMIT" "$gpurun" --local "$cfg" train.steps=1000000 train.eval_every=0 \
    data.val= train.batch_size=2 train.coll_timeout_s=2 train.out_dir="$work/stop" \
    >"$work/out" 2>"$work/err" </dev/null &
job=$!
stopped=
for _ in $(seq 300); do
    if [ -s "$work/stop/metrics.jsonl" ]; then
        for p in $(pgrep -x gpurun-train); do
            if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx 'RANK=1' &&
                tr '\0' '\n' <"/proc/$p/cmdline" 2>/dev/null | grep -qF "$work/stop"; then
                stopped=$p
            fi
        done
    fi
    [ -n "$stopped" ] && break
    sleep 0.1
done
[ -n "$stopped" ] || { kill "$job" 2>/dev/null; fail "rank 1 of the coll_timeout_s run not found"; }
kill -STOP "$stopped"
t0=$(date +%s%N)
rc=0
wait "$job" || rc=$?
took=$((($(date +%s%N) - t0) / 1000000))
kill -CONT "$stopped" 2>/dev/null || true
[ "$rc" != 0 ] || fail "the job with a stopped rank exited 0"
grep -q "no data from rank 1 (.*) for 2000 ms during" "$work/out" "$work/err" ||
    fail "rank 0 did not name the silent rank 1: $(grep -h '^\[0\]' "$work/out" "$work/err" | tail -n 3)"
[ "$took" -lt 30000 ] || fail "the job took $took ms to fail after rank 1 stopped"
echo "# a stopped rank: its peer failed after train.coll_timeout_s=2, the job ended $took ms later"
