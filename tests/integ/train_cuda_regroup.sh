#!/usr/bin/env bash
# gpurun-train on cuda regrouping in process over NCCL (train.regroup, gr_regroup): a
# gpurun --local run of 2 nodes of 1 rank and a spare, train.device=cuda; past step S node
# 1's rendezvousd is SIGKILLed (its rank dies with it). Rank 0's NCCL collective fails (the
# peer's loss: ncclRemoteError), it aborts the communicator and keeps its process: the leader
# names generation 1 with the spare in node 1's place, rank 0 makes a new communicator with the
# spare's new rank, which takes rank 0's state, and the run goes on from the last completed
# step. Every later loss and the final parameters and moments equal an undisturbed run's, bit
# for bit. Under ZeRO-1 (a lost rank's optimizer shard lives only in the checkpoints) the
# regroup goes back to rank 0's memory checkpoint, again bit for bit.
# timeout: 400
set -euo pipefail
# shellcheck source=train_cuda_common.sh
. "$(dirname "$0")/train_cuda_common.sh"
pick_flavour
GPURUN_LIMIT=$CUDA_LIMIT

cd "$work"
if [ "$flavour" = cuda ]; then
    steps=3000 at=1000
else
    steps=120 at=40
fi
args=("$cfg" "train.steps=$steps" train.eval_every=0 data.val= train.ckpt_every=0 train.log_every=1
    train.dtype=fp32 train.device=cuda)

# hit NAME ARGS...: the run with node 1's daemon SIGKILLed past step $at, in $work/NAME.{out,err}.
hit() {
    local name=$1 pid victim
    shift
    timeout -k 5 "$GPURUN_LIMIT" "$gpurun" --local -N 2 --gpus-per-node 1 --spare-nodes 1 \
        --max-restarts 1 --kill-grace 1 --log-level info --job-dir "$work/job-$name" -- \
        "$cuda_bin" "${args[@]}" "$@" train.out_dir="$name" >"$work/$name.out" \
        2>"$work/$name.err" </dev/null &
    pid=$!
    bg_pids+=("$pid")
    fail_show=("$name.out" "$name.err")
    for _ in $(seq 3000); do
        [ -s "$name/metrics.jsonl" ] && [ "$(wc -l <"$name/metrics.jsonl")" -ge "$at" ] && break
        sleep 0.05
    done
    [ "$(wc -l <"$name/metrics.jsonl")" -ge "$at" ] || fail "$name: the run never got past step $at"
    victim=$(daemon_pid "$work/job-$name" 1)
    [ -n "$victim" ] || fail "$name: no rendezvousd of node 1"
    kill -KILL "$victim"
    rc=0
    wait "$pid" || rc=$?
    expect_rc 0 "$name: the run whose node 1 was lost"
}

run --local -N 2 --gpus-per-node 1 -- "$cuda_bin" "${args[@]}" train.out_dir=ref
expect_rc 0 "the undisturbed run"
grep -q '^\[0\] run: .*, nccl: 2 ranks' "$work/out" ||
    fail "the run line does not show NCCL over 2 ranks: $(grep '^\[0\] run:' "$work/out")"

hit hit
grep -q "node 1 lost: the ranks of the other nodes regroup in process with the spare's, as generation 1" \
    "$work/hit.err" || fail "the leader did not regroup in process: $(grep -m3 'lost\|regroup\|restart' "$work/hit.err")"
[ "$(grep -c '^\[0\] run: ' "$work/hit.out")" = 1 ] ||
    fail "rank 0 started more than once: $(grep '^\[0\] run: ' "$work/hit.out")"
lost=$(sed -n 's/^\[0\] a peer was lost after step \([0-9]*\): .*/\1/p' "$work/hit.out")
from=$(sed -n 's/^\[0\] regrouped in process as generation 1: going on from step \([0-9]*\) (the live state of rank 0)$/\1/p' "$work/hit.out")
if [ -z "$lost" ] || [ -z "$from" ]; then
    fail "rank 0 did not say it regrouped: $(grep -m3 '^\[0\] \(a peer\|regroup\)' "$work/hit.out")"
fi
grep -m1 '^\[0\] a peer was lost' "$work/hit.out" | grep -q 'nccl' ||
    fail "the failure rank 0 names is not NCCL's: $(grep -m1 '^\[0\] a peer was lost' "$work/hit.out")"
[ "$from" -ge "$lost" ] || fail "went on from step $from, before step $lost"
diff <(losses ref/metrics.jsonl | awk -v f="$from" '$1 > f') \
    <(losses hit/metrics.jsonl | awk -v f="$from" '$1 > f') >"$work/diff" || {
    head -n 20 "$work/diff"
    fail "the losses after the regroup differ from the undisturbed run's"
}
final=$(printf 'ckpt_%08d.bin' "$steps")
cmp -s <(state_of "ref/$final") <(state_of "hit/$final") ||
    fail "the step-$steps checkpoints' parameters and moments differ"
ok "node 1 lost past step $at: rank 0 kept its process, a new NCCL communicator with the spare from step $from; bit for bit the undisturbed run"

# ZeRO-1: a lost rank's optimizer shard lives only in the checkpoints, so the regroup goes back
# to rank 0's memory checkpoint (every 10 steps here), still without a new process.
run --local -N 2 --gpus-per-node 1 -- "$cuda_bin" "${args[@]}" train.zero=1 train.out_dir=ref-zero
expect_rc 0 "the undisturbed run, zero 1"
# Killed between two memory checkpoints: the steps after the last one are done again.
at=$((at + 5))
hit zero train.zero=1 train.mem_ckpt_every=10
grep -q "node 1 lost: the ranks of the other nodes regroup in process with the spare's, as generation 1" \
    "$work/zero.err" || fail "zero 1: the leader did not regroup in process: $(grep -m3 'lost\|regroup\|restart' "$work/zero.err")"
[ "$(grep -c '^\[0\] run: ' "$work/zero.out")" = 1 ] ||
    fail "zero 1: rank 0 started more than once: $(grep '^\[0\] run: ' "$work/zero.out")"
lost=$(sed -n 's/^\[0\] a peer was lost after step \([0-9]*\): .*/\1/p' "$work/zero.out")
from=$(sed -n 's/^\[0\] regrouped in process as generation 1: going on from step \([0-9]*\) (the memory checkpoint of step \1)$/\1/p' \
    "$work/zero.out")
[ -n "$lost" ] || fail "zero 1: rank 0 did not say it lost its peer"
[ -n "$from" ] ||
    fail "zero 1: rank 0 did not say it regrouped from its memory checkpoint: $(grep -m3 '^\[0\] \(a peer\|regroup\)' "$work/zero.out")"
if [ $((from % 10)) != 0 ] || [ "$from" -gt "$lost" ] || [ $((lost - from)) -gt 10 ]; then
    fail "zero 1: went on from step $from, lost after step $lost (memory checkpoints every 10)"
fi
diff <(losses ref-zero/metrics.jsonl) <(losses zero/metrics.jsonl) >"$work/diff" || {
    head -n 20 "$work/diff"
    fail "zero 1: the losses differ from the undisturbed run's"
}
cmp -s <(state_of "ref-zero/$final") <(state_of "zero/$final") ||
    fail "zero 1: the step-$steps checkpoints' parameters and moments differ"
ok "ZeRO-1: node 1 lost after step $lost: rank 0 kept its process, back to its memory checkpoint of step $from; bit for bit the undisturbed run"
