#!/usr/bin/env bash
# Signals to `gpurun --local`: SIGTERM, SIGINT and SIGHUP reach the daemons, every rank is
# gone when gpurun exits, and gpurun dies of the signal it got (128+N); SIGUSR1 (the
# pre-timeout signal) reaches no rank that did not ask for it; -t ends a job that runs too
# long with 124.
# timeout: 180
set -euo pipefail
# shellcheck source=local_common.sh
. "$(dirname "$0")/local_common.sh"

# A rank that records its pid, says it is up, and sleeps.
# shellcheck disable=SC2016 # expanded by the ranks' shell
sleeper='echo $$ >"$GPURUN_JOB_DIR/pid.$RANK"; echo up; exec sleep 60'

# start NAME NODES CMD...: gpurun --local running CMD on NODES nodes of 2 ranks, in the
# background; sets pid and job; waits until every rank is up.
start() {
    local name=$1 nodes=$2
    shift 2
    job=$work/$name
    # A fresh output file: the last job's lines must not count as this one's.
    : >"$work/out"
    "$gpurun" --local -N "$nodes" --gpus-per-node 2 --kill-grace 2 --job-dir "$job" -- "$@" \
        >"$work/out" 2>"$work/err" </dev/null &
    pid=$!
    bg_pids+=("$pid")
    wait_for_lines "$work/out" $((2 * nodes))
}

# stop_with SIG WANT: sends SIG to gpurun, expects it to end with WANT within the grace, and
# no rank of its job to be left.
stop_with() {
    local sig=$1 want=$2 t0 ms f rpid
    rc=0
    t0=$(date +%s%N)
    kill "-$sig" "$pid"
    wait "$pid" || rc=$?
    ms=$((($(date +%s%N) - t0) / 1000000))
    expect_rc "$want" "gpurun after SIG$sig"
    [ "$ms" -lt 8000 ] || fail "gpurun took $ms ms to end after SIG$sig"
    for f in "$job"/pid.*; do
        rpid=$(cat "$f")
        if kill -0 "$rpid" 2>/dev/null && ! grep -q '^State:.*Z' "/proc/$rpid/status" 2>/dev/null; then
            fail "rank ${f##*.} (pid $rpid) outlived gpurun after SIG$sig"
        fi
    done
    echo "# SIG$sig: gpurun ended with $rc after $ms ms, all ranks gone"
}

start term 1 sh -c "$sleeper"
stop_with TERM 143

start int 2 sh -c "$sleeper"
stop_with INT 130
[ -f "$job/summary.json" ] || fail "no summary.json after SIGINT"
grep -qE '"outcome": "(cancelled|failed)"' "$job/summary.json" ||
    fail "summary.json after SIGINT: $(grep outcome "$job/summary.json")"

start hup 1 sh -c "$sleeper"
stop_with HUP 129

# SIGUSR1 is the pre-timeout signal: it reaches only the ranks that asked for it, and these
# ranks did not (a shell has no rank library), so they run on, and SIGTERM ends the job.
# shellcheck disable=SC2016 # expanded by the ranks' shell
start usr1 1 sh -c 'echo $$ >"$GPURUN_JOB_DIR/pid.$RANK"; trap "echo got usr1; exit 0" USR1
echo up; while :; do sleep 0.05; done'
kill -USR1 "$pid"
sleep 0.5
kill -0 "$pid" 2>/dev/null || fail "SIGUSR1 ended a job whose ranks did not ask for it"
grep -q 'got usr1' "$work/out" && fail "a rank that did not ask for SIGUSR1 got it"
stop_with TERM 143

# The time limit: 1 s, then the job is stopped and gpurun exits 124.
t0=$(date +%s%N)
run --local --gpus-per-node 2 --kill-grace 1 -t 0:01 -- sleep 30
ms=$((($(date +%s%N) - t0) / 1000000))
expect_rc 124 "a job past its time limit"
grep -q "time limit of 1 s reached" "$work/err" || fail "no message for the time limit"
[ "$ms" -lt 8000 ] || fail "the 1 s time limit ended the job after $ms ms"
echo "# time limit: 124 after $ms ms"
