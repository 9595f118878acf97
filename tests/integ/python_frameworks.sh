#!/usr/bin/env bash
# gpurun's framework callbacks with the real frameworks: a tiny model trained on CPUs (gloo)
# by PyTorch Lightning with gpurun.lightning.GpurunCallback, then by the Hugging Face Trainer
# with gpurun.hf.GpurunTrainerCallback (tests/python/frameworks.py), each under `gpurun
# --local --gpus-per-node 2`: `gpurun status --json` shows every rank's step, loss, lr and
# total_steps from the callback while it trains; SIGUSR1 to gpurun stops both ranks at the
# same step with a checkpoint, and the job completes 0.
#
# The frameworks are not Debian packages: the smallest sets that import against Debian's
# torch 1.13 are installed once with pip (fw_common.sh's fw_install) into
# $GPURUN_PYDEPS/<framework> (default $BUILD/python-deps) and kept there. A framework whose
# install fails or takes over PIP_LIMIT seconds is skipped, with the reason.
# timeout: 600
set -euo pipefail
# shellcheck source=fw_common.sh
. "$(dirname "$0")/fw_common.sh"

fw_need_python

skipped=()

# install NAME PKG...: fw_install, its reason for failing kept in skipped.
install() {
    fw_install "$@" && return 0
    skipped+=("$fw_why")
    return 1
}

# train NAME: the job of frameworks.py NAME, its reports checked while it trains, then
# stopped by SIGUSR1.
train() {
    local name=$1 job=$work/$1 out=$work/$1.ckpt t0 i got steps line
    mkdir -p "$out"
    : >"$work/out"
    t0=$(date +%s%N)
    PYTHONPATH=$deps/$name "$gpurun" --local --gpus-per-node 2 \
        --kill-grace 5 --job-dir "$job" -- "$python" "$root/tests/python/frameworks.py" \
        "$name" "$out" >"$work/out" 2>"$work/err" </dev/null &
    pid=$!
    bg_pids+=("$pid")
    # Until both ranks reported a few steps: their step, a finite positive loss, the
    # optimizer's lr (0.05) and the run's total steps (1000).
    got=
    for ((i = 0; i < 600; i++)); do
        kill -0 "$pid" 2>/dev/null || break
        timeout -k 2 20 "$gpurun" status --job-dir "$job" --json >"$work/status.json" \
            2>/dev/null || true
        got=$("$python" -c '
import json, math, sys
ranks = json.load(open(sys.argv[1]))["live"]["ranks"]
ok = len(ranks) == 2 and all(r["step"] >= 5 and math.isfinite(r["loss"]) and r["loss"] > 0
                             and abs(r["lr"] - 0.05) < 1e-9 and r["total_steps"] == 1000
                             for r in ranks)
print("ok" if ok else " | ".join("rank %d step %d loss %s lr %s total_steps %d" % (
    r["rank"], r["step"], r["loss"], r["lr"], r["total_steps"]) for r in ranks))' \
            "$work/status.json" 2>/dev/null) || true
        [ "$got" = ok ] && break
        sleep 0.2
    done
    [ "$got" = ok ] || fail "$name: status never showed both ranks' reports (step >= 5," \
        "loss > 0, lr 0.05, total_steps 1000); last: '$got'"
    echo "# $name: reports in status after $((($(date +%s%N) - t0) / 1000000)) ms"
    kill -USR1 "$pid"
    for ((i = 0; i < 600; i++)); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    ! kill -0 "$pid" 2>/dev/null || fail "$name: the job still runs 60 s after SIGUSR1"
    rc=0
    wait "$pid" || rc=$?
    expect_rc 0 "the $name job after SIGUSR1"
    # Each rank's last line: "NAME VERSION rank R: stopped at step S of 1000,
    # preempt_requested True, checkpoint saved|checkpoint-S".
    line="^\[[01]\] $name [^ ]+ rank [01]: stopped at step ([0-9]+) of 1000,"
    line+=" preempt_requested True, checkpoint (saved|checkpoint-[0-9]+)$"
    [ "$(grep -cE "$line" "$work/out")" = 2 ] ||
        fail "$name: not both ranks stopped by the signal with a checkpoint"
    steps=$(sed -nE "s/$line/\1/p" "$work/out" | sort -u)
    if [ "$(echo "$steps" | wc -l)" != 1 ] || [ "$steps" -lt 5 ] || [ "$steps" -ge 1000 ]; then
        fail "$name: the ranks stopped at steps '$(echo "$steps" | paste -sd ' ')'," \
            "expected one step in 5..999"
    fi
    echo "# $name: $(grep -m1 "stopped at step" "$work/out" | sed 's/^\[.\] //');" \
        "job done in $((($(date +%s%N) - t0) / 1000000)) ms"
}

if install lightning "${FW_LIGHTNING[@]}"; then
    train lightning
    [ -s "$work/lightning.ckpt/preempted.ckpt" ] || fail "lightning: no preempted.ckpt"
fi
if install hf "${FW_HF[@]}"; then
    train hf
    ls -d "$work/hf.ckpt"/checkpoint-* >/dev/null 2>&1 || fail "hf: no checkpoint-N"
fi
if [ ${#skipped[@]} -gt 0 ]; then
    reason=$(printf '%s; ' "${skipped[@]}")
    skip "${reason%; }"
fi
