#!/usr/bin/env bash
# Signals: SIGTERM to gpurun-train finishes the step, saves a checkpoint and exits 0, and a
# resumed run goes on from there exactly as a run that was never stopped (a constant learning
# rate, so that runs of different lengths agree). SIGUSR1 to `gpurun --local` reaches both
# ranks, which stop after the same step, save one checkpoint, and the job completes; while
# it runs, `gpurun status` shows the ranks' step and loss, and the total steps they report (not
# those of the train.cfg as edited after the start).
# timeout: 240
set -euo pipefail
# shellcheck source=train_common.sh
. "$(dirname "$0")/train_common.sh"

long=(train.steps=1000000 train.eval_every=0 train.log_every=1000 optim.min_lr=1e-3
    optim.warmup_steps=0)

# wait_steps FILE N: waits (up to 60 s) until the metrics FILE has N lines.
wait_steps() {
    local i
    for ((i = 0; i < 600; i++)); do
        [ -f "$1" ] && [ "$(wc -l <"$1")" -ge "$2" ] && return 0
        sleep 0.1
    done
    fail "'$1' did not reach $2 steps in 60 s"
}

# --- SIGTERM, one rank ------------------------------------------------------------------------
"$train_bin" "$cfg" "${long[@]}" train.out_dir="$work/a" >"$work/out" 2>"$work/err" </dev/null &
pid=$!
bg_pids+=("$pid")
wait_steps "$work/a/metrics.jsonl" 5
kill -TERM "$pid"
rc=0
wait "$pid" || rc=$?
expect_rc 0 "gpurun-train after SIGTERM"
k=$(losses "$work/a/metrics.jsonl" | tail -n 1 | cut -d' ' -f1)
expect_out_line "stopped by a signal after step $k; continue with train.resume=1"
ckpt=$(printf '%s/a/ckpt_%08d.bin' "$work" "$k")
[ -f "$ckpt" ] || fail "no checkpoint of step $k after SIGTERM: $(ls "$work/a")"
grep -qF "saved '$ckpt' (" "$work/out" || fail "no line for the checkpoint of step $k"
echo "# SIGTERM: stopped after step $k with a checkpoint"

n=$((k + 4))
train "$cfg" "${long[@]}" train.out_dir="$work/a" train.resume=1 train.steps=$n
expect_rc 0 "resume after SIGTERM"
expect_out_line "resuming from '$ckpt' at step $k"
train "$cfg" "${long[@]}" train.out_dir="$work/b" train.steps=$n
expect_rc 0 "$n steps at once"
diff <(losses "$work/a/metrics.jsonl") <(losses "$work/b/metrics.jsonl") >"$work/diff" || {
    head -n 20 "$work/diff"
    fail "stopped at $k and resumed to $n: the losses differ from $n steps at once"
}
echo "# resumed to step $n: bit-identical to a run that was not stopped"

# --- SIGUSR1 through gpurun --local, two ranks ------------------------------------------------
# The steps in the train.cfg itself, which is edited once the ranks run: the status's total is
# what they report, not what the file says by then.
job=$work/job
sed 's/^steps = .*/steps = 1000000/' "$cfg" >"$work/long.cfg"
"$gpurun" --local --gpus-per-node 2 --job-dir "$job" "$work/long.cfg" "${long[@]:1}" \
    train.batch_size=2 train.out_dir="$work/c" >"$work/out" 2>"$work/err" </dev/null &
pid=$!
bg_pids+=("$pid")
wait_steps "$work/c/metrics.jsonl" 5
sed -i 's/^steps = .*/steps = 7/' "$work/long.cfg"
# The agents pass progress on to the leader with their heartbeats: ask until it is there.
for ((i = 0; i < 100; i++)); do
    run status --job-dir "$job"
    expect_rc 0 "gpurun status of a training job"
    grep -qE '^1 +0 +[^ ]+ +running +[1-9][0-9]* +[0-9]+\.[0-9]{4} ' "$work/out" && break
    sleep 0.1
done
for r in 0 1; do
    grep -qE "^$r +0 +[^ ]+ +running +[1-9][0-9]* +[0-9]+\.[0-9]{4} " "$work/out" ||
        fail "status shows no step and loss for rank $r"
done
grep -qE '^step: [1-9][0-9]*( \(the slowest rank at [0-9]+\))? of 1000000, loss [0-9.]+' "$work/out" || fail "status shows no step line"
kill -USR1 "$pid"
rc=0
wait "$pid" || rc=$?
expect_rc 0 "gpurun after SIGUSR1 to a training job"
k=$(losses "$work/c/metrics.jsonl" | tail -n 1 | cut -d' ' -f1)
grep -qxF "[0] stopped by a signal after step $k; continue with train.resume=1" "$work/out" ||
    fail "rank 0 did not stop after step $k"
[ "$(cd "$work/c" && echo ckpt_*.bin)" = "$(printf 'ckpt_%08d.bin' "$k")" ] ||
    fail "after SIGUSR1 at step $k the out_dir holds $(ls "$work/c")"
grep -q '"outcome": "completed"' "$job/summary.json" ||
    fail "summary.json: $(grep outcome "$job/summary.json")"
echo "# SIGUSR1: both ranks stopped after step $k, one checkpoint, job completed"
