#!/usr/bin/env bash
# A run started again in the same out_dir never deletes a checkpoint. train.resume=auto (the
# default) goes on from the newest valid checkpoint, and starts at step 0 only where there is
# none; checkpoints of another run (another model, other training data) are refused with one
# line that names out_dir and the ways on. train.resume=0 starts at step 0 and refuses an
# out_dir that holds checkpoints; train.resume=1 refuses one that holds none. Each refusal
# exits 1 and leaves out_dir as it was. A generation that gpurun restarts goes on from the
# checkpoints whatever train.resume says.
# timeout: 120
set -euo pipefail
# shellcheck source=train_common.sh
. "$(dirname "$0")/train_common.sh"

cd "$work"
# listing DIR: the names, sizes and modification times of DIR's files.
listing() {
    (cd "$1" && ls -l --time-style=+%s.%N)
}

# expect_refusal DIR LINE ARGS...: gpurun-train small.cfg ARGS in DIR exits 1 with LINE as its
# stderr, and DIR is left as it was.
expect_refusal() {
    local dir=$1 want=$2 before
    shift 2
    before=$(listing "$dir")
    train small.cfg train.out_dir="$dir" "$@"
    expect_rc 1 "gpurun-train in '$dir' with $*"
    [ "$(cat "$work/err")" = "gpurun-train: $want" ] ||
        fail "with $*: stderr is '$(cat "$work/err")', expected 'gpurun-train: $want'"
    [ "$(listing "$dir")" = "$before" ] || fail "with $*: '$dir' changed: $(listing "$dir")"
}

# --- auto, the default: a second run goes on from the first -------------------------------------
train small.cfg train.steps=4 train.ckpt_every=2 train.out_dir=a
expect_rc 0 "4 steps"
expect_out_line "no checkpoint in 'a': starting from step 0"
train small.cfg train.steps=6 train.ckpt_every=2 train.out_dir=a
expect_rc 0 "the same command again, to step 6"
expect_out_line "resuming from 'a/ckpt_00000004.bin' at step 4"
[ "$(steps_of a/metrics.jsonl)" = "1 2 3 4 5 6" ] ||
    fail "after a re-run metrics.jsonl holds steps $(steps_of a/metrics.jsonl)"
[ "$(cd a && echo ckpt_*)" = "ckpt_00000004.bin ckpt_00000006.bin" ] ||
    fail "after a re-run 'a' holds $(cd a && echo ckpt_*)"
# Once more with the same steps: nothing to do, nothing removed.
before=$(listing a)
train small.cfg train.steps=6 train.out_dir=a
expect_rc 0 "a re-run of a finished run"
expect_out_line "nothing to do: the run is at step 6 of 6"
[ "$(listing a | grep ckpt_)" = "$(grep ckpt_ <<<"$before")" ] ||
    fail "a re-run of a finished run changed its checkpoints: $(listing a)"
echo "# auto: a re-run goes on from the newest checkpoint"

# --- auto: another run's checkpoints are refused -------------------------------------------------
expect_refusal a "out_dir 'a' holds another run's checkpoints ('a/ckpt_00000006.bin': n_layer is 2 in the checkpoint, 3 in the config): to start afresh, give another train.out_dir or move them out of 'a'" \
    model.n_layer=3
n=$(od -An -t d4 -j 8 -N 4 data/val_000000.bin | tr -d ' ')
nt=$(od -An -t d4 -j 8 -N 4 data/train_000000.bin | tr -d ' ')
expect_refusal a "out_dir 'a' holds another run's checkpoints ('a/ckpt_00000006.bin': the training data changed: $nt tokens ($(((nt - 1) / 32)) sequences) then, $n ($(((n - 1) / 32))) now in 'data/val_000000.bin'): to start afresh, give another train.out_dir or move them out of 'a'" \
    data.train=data/val_000000.bin
echo "# auto: checkpoints of another model or data refused, nothing removed"

# --- train.resume=0: never over checkpoints -----------------------------------------------------
expect_refusal a "out_dir 'a' holds 2 checkpoints (the newest 'a/ckpt_00000006.bin') and train.resume is 0: to continue them, set train.resume=auto; to start afresh, give another train.out_dir or move them out of 'a'" \
    train.resume=0
# A set-aside damaged checkpoint and a killed save's temp file are no checkpoints: a fresh run
# starts, cleans the temp file, keeps the damaged one.
mkdir z
head -c 100 /dev/zero >z/ckpt_00000009.bin.damaged
printf '{"step": 1}\n' >z/metrics.jsonl
train small.cfg train.steps=2 train.out_dir=z train.resume=0
expect_rc 0 "train.resume=0 in an out_dir without checkpoints"
[ -f z/ckpt_00000009.bin.damaged ] || fail "the damaged file went: $(ls z)"
[ "$(steps_of z/metrics.jsonl)" = "1 2" ] ||
    fail "a fresh run's metrics.jsonl holds steps $(steps_of z/metrics.jsonl)"
echo "# train.resume=0: refused over checkpoints, nothing removed"

# --- train.resume=1: a checkpoint is required ---------------------------------------------------
mkdir e
expect_refusal e "cannot resume: no checkpoint in 'e' (train.resume=auto would start at step 0)" \
    train.resume=1
train small.cfg train.steps=8 train.out_dir=a train.resume=1
expect_rc 0 "train.resume=1 with checkpoints"
expect_out_line "resuming from 'a/ckpt_00000006.bin' at step 6"
echo "# train.resume=1: refused without a checkpoint"

# --- a restarted generation goes on whatever train.resume says ---------------------------------
GPURUN_RESTART_COUNT=1 train small.cfg train.steps=9 train.out_dir=a train.resume=0
expect_rc 0 "a restarted generation with train.resume=0"
expect_out_line "resuming from 'a/ckpt_00000008.bin' at step 8"
echo "# a restarted generation resumes with train.resume=0"
