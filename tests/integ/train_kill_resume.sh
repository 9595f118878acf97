#!/usr/bin/env bash
# Checkpoints survive SIGKILL at any moment: a run checkpointing every step is killed at random
# moments 15 times and resumed each time. Every file with a checkpoint's final name must be
# complete (its SHA-256 trailer matches), every resume must load the newest of them and go
# forward, each start must remove the temp files the killed saves left, and the run finished
# at last must equal an uninterrupted run bit for bit (losses, parameters and moments). The
# random delays come from a seed printed first: TRAIN_KILL_SEED=N replays a run.
# timeout: 120
set -euo pipefail
# shellcheck source=train_common.sh
. "$(dirname "$0")/train_common.sh"

cd "$work"
seed=${TRAIN_KILL_SEED:-$$}
RANDOM=$seed
echo "# seed $seed"
kills=15
# Enough steps that 15 starts (each running 0-30 ms, a few steps of about 3 ms with a save
# each) never reach the end on a quiet, fast machine.
steps=300
args=(small.cfg "train.steps=$steps" train.ckpt_every=1 train.eval_every=0)

# check_complete DIR: every final-named checkpoint's trailer is the SHA-256 of the rest.
check_complete() {
    local f size want got
    for f in "$1"/ckpt_*.bin; do
        [ -e "$f" ] || continue
        size=$(stat -c %s "$f")
        want=$(tail -c 32 "$f" | od -An -v -t x1 | tr -d ' \n')
        got=$(head -c $((size - 32)) "$f" | sha256sum | cut -d' ' -f1)
        [ "$want" = "$got" ] || fail "'$f' is torn: its trailer says $want, its content hashes to $got"
    done
}

# newest_step DIR: the highest step among DIR's final-named checkpoints, or 0.
newest_step() {
    local f s best=0
    for f in "$1"/ckpt_*.bin; do
        [ -e "$f" ] || continue
        s=${f##*/ckpt_}
        s=$((10#${s%.bin}))
        [ "$s" -gt "$best" ] && best=$s
    done
    echo "$best"
}

# count_tmp DIR: the temp files of saves in DIR.
count_tmp() {
    local f n=0
    for f in "$1"/ckpt_*.bin.tmp.*; do
        [ -e "$f" ] && n=$((n + 1))
    done
    echo "$n"
}

train "${args[@]}" train.out_dir=ref
expect_rc 0 "the uninterrupted run"

t0=$SECONDS
last=0
killed=0
leftover=0
for ((k = 1; k <= kills; k++)); do
    check_complete kill
    at=$(newest_step kill)
    [ "$at" -ge "$last" ] || fail "kill $k: the newest checkpoint went back from step $last to $at"
    tmps=$(count_tmp kill)
    leftover=$((leftover + tmps))
    # train.resume=auto (the default, named here): the first start, and any killed before a
    # save, finds no checkpoint and starts at step 0; the others resume.
    "$train_bin" "${args[@]}" train.out_dir=kill train.resume=auto >"$work/out" 2>"$work/err" \
        </dev/null &
    pid=$!
    bg_pids+=("$pid")
    # One start in four is killed early (0 to 30 ms: in the start, the load, the first step);
    # the others once they saved a checkpoint, then 0 to 15 ms later: anywhere in a step or a
    # save, whatever this machine's speed.
    if [ $((RANDOM % 4)) = 0 ]; then
        sleep "0.$(printf '%03d' $((RANDOM % 31)))"
    else
        for _ in $(seq 2000); do
            grep -q '^saved ' "$work/out" && break
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.005
        done
        sleep "0.$(printf '%03d' $((RANDOM % 16)))"
    fi
    kill -KILL "$pid" 2>/dev/null || true
    rc=0
    wait "$pid" || rc=$?
    bg_pids=()
    [ "$rc" = 137 ] || [ "$rc" = 0 ] || fail "kill $k: gpurun-train exited $rc"
    # What this start said about where it began, when it got that far.
    if [ "$at" -gt 0 ]; then
        want=$(printf "resuming from 'kill/ckpt_%08d.bin' at step %d" "$at" "$at")
        if grep -q '^resuming from' "$work/out"; then
            grep -qxF "$want" "$work/out" ||
                fail "kill $k: expected '$want', got '$(grep '^resuming from' "$work/out")'"
        fi
    fi
    if [ "$tmps" -gt 0 ] && grep -q '^resuming from' "$work/out"; then
        grep -q "^out_dir 'kill': removed $tmps temp files\? of interrupted saves" "$work/out" ||
            fail "kill $k: $tmps temp files were there, the start did not say it removed them"
    fi
    [ "$rc" = 0 ] && break
    killed=$((killed + 1))
    last=$at
done
check_complete kill
at=$(newest_step kill)
echo "# $killed kills in $((SECONDS - t0)) s, the last at step $at; $leftover temp files left by them"
[ "$at" -lt "$steps" ] || fail "the run finished before the kills were done: kill fewer or later"

train "${args[@]}" train.out_dir=kill train.resume=1
expect_rc 0 "the last resume"
expect_out_line "$(printf "resuming from 'kill/ckpt_%08d.bin' at step %d" "$at" "$at")"
diff <(losses ref/metrics.jsonl) <(losses kill/metrics.jsonl) >"$work/diff" || {
    head -n 20 "$work/diff"
    fail "the killed and resumed run's losses differ from the uninterrupted run's"
}
final=$(printf 'ckpt_%08d.bin' "$steps")
cmp -s <(state_of "ref/$final") <(state_of "kill/$final") ||
    fail "the step-$steps checkpoints' parameters and moments differ"
left=$(count_tmp kill)
[ "$left" = 0 ] || fail "temp files left at the end: $(ls kill)"
echo "# $killed SIGKILLs, each resume from the newest complete checkpoint; the result is bit-identical"
