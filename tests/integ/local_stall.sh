#!/usr/bin/env bash
# No false node loss on a busy machine: a daemon judges its peers' heartbeats only over the
# time it was itself running. Under a CPU hog (three busy loops per CPU, for the whole
# script): short jobs of 1 and 2 nodes all exit 0; a 1-node job whose daemon (the leader,
# and the agent it judges) is stopped for longer than the heartbeat timeout, then continued,
# exits 0, the stall logged and no node lost; a 2-node job all of whose processes (daemons,
# shims, ranks) are stopped as long and continued, as Slurm's suspend and resume do, exits 0;
# and failure detection is kept: the daemon of node 1, or of node 0, stopped as long while
# the other runs is lost, and the job fails.
# timeout: 90
set -euo pipefail
# shellcheck source=local_common.sh
. "$(dirname "$0")/local_common.sh"

# A heartbeat every 100 ms, a node lost after 1 s without one; the stops last 2.5 s.
hb=(--heartbeat 0.1 --heartbeat-timeout 1)
stop_ms=2500
jobs_1=20
jobs_2=10

# The ranks' command: rank $STOP_RANK stops its own daemon (its shim's parent) and exits; the
# others, one a node on the other daemons, run on for 4 s, so that a node that loses its leader
# fences a running rank (a job whose ranks had all ended well would rightly complete). The
# stopped daemon has no rank left running, so that its shims (which end a rank whose agent is
# frozen) are not what is tested.
# shellcheck disable=SC2016 # expanded by the ranks' shell
stop_own='[ "$RANK" = "$STOP_RANK" ] || exec sleep 4
read -r _ _ _ d _ </proc/$PPID/stat
echo "$d" >"$GPURUN_JOB_DIR/daemon.tmp" && mv "$GPURUN_JOB_DIR/daemon.tmp" "$GPURUN_JOB_DIR/daemon"
kill -STOP "$d"'

stopped=()
# What the script stopped is continued whatever happens, so that it can end.
cont_stopped() {
    [ "${#stopped[@]}" = 0 ] || kill -CONT "${stopped[@]}" 2>/dev/null || true
}
exit_hooks+=(cont_stopped)

hog=$(($(nproc) * 3))
for ((i = 0; i < hog; i++)); do
    (while :; do :; done) &
    bg_pids+=("$!")
done
echo "# $hog busy loops on $(nproc) CPUs"

# --- short jobs under the hog ----------------------------------------------------------------
t0=$SECONDS
for ((i = 1; i <= jobs_1 + jobs_2; i++)); do
    nodes=1
    [ "$i" -le "$jobs_1" ] || nodes=2
    run --local -N "$nodes" "${hb[@]}" -- true
    expect_rc 0 "short job $i ($nodes nodes) under the hog"
done
echo "# $jobs_1 1-node and $jobs_2 2-node jobs under the hog exited 0 in $((SECONDS - t0)) s"

# stop_run NAME STOP_RANK ARGS...: gpurun --local ARGS running $stop_own, in the background;
# once rank STOP_RANK has stopped its daemon, keeps it stopped for stop_ms and continues it,
# then waits for gpurun: sets rc, and held (how long the daemon was stopped, in ms).
stop_run() {
    local name=$1 pid d t0 i
    export STOP_RANK=$2
    shift 2
    job=$work/$name
    {
        rc=0
        timeout -k 5 "$GPURUN_LIMIT" "$gpurun" --local --job-dir "$job" "$@" -- sh -c "$stop_own" \
            >"$work/out" 2>"$work/err" </dev/null || rc=$?
        echo "$rc" >"$work/rc"
    } &
    pid=$!
    bg_pids+=("$pid")
    for ((i = 0; i < 200; i++)); do
        [ -s "$job/daemon" ] && break
        sleep 0.05
    done
    [ -s "$job/daemon" ] || fail "$name: rank $STOP_RANK did not stop its daemon"
    d=$(cat "$job/daemon")
    stopped=("$d")
    t0=$(date +%s%N)
    for ((i = 0; i < 200; i++)); do
        [ "$(awk '{ print $3 }' "/proc/$d/stat")" = T ] && break
        sleep 0.01
    done
    [ "$(awk '{ print $3 }' "/proc/$d/stat")" = T ] || fail "$name: daemon $d is not stopped"
    sleep "$((stop_ms / 1000)).$((stop_ms % 1000))"
    # Gone already where the leader lost it: gpurun kills a daemon the leader gave up.
    kill -CONT "$d" 2>/dev/null || true
    stopped=()
    held=$((($(date +%s%N) - t0) / 1000000))
    wait "$pid" || true
    rc=$(cat "$work/rc")
}

# --- the judge stopped: a 1-node job's daemon, leader and agent at once ----------------------
# While it is stopped nothing is read, and what each side sent waits in the sockets: neither
# may blame the other for the time it was not running itself.
stop_run self 0 "${hb[@]}"
expect_rc 0 "a 1-node job whose daemon was stopped for $held ms (heartbeat timeout 1 s)"
! grep -q "no heartbeat" "$work/err" || fail "a node was lost for its own daemon's stall: $(grep "no heartbeat" "$work/err")"
grep -q "node 0's daemon stalled for [0-9]* ms" "$work/err" || fail "the stall of $held ms was not logged"
echo "# 1-node daemon stopped $held ms under the hog: exit 0; $(grep -o "node 0's daemon stalled for [0-9]* ms" "$work/err")"

# --- the judged stopped: node 1's daemon, while the leader runs ------------------------------
stop_run peer 1 -N 2 "${hb[@]}"
[ "$rc" != 0 ] || fail "a job whose node 1 daemon was stopped for $held ms exited 0"
grep -q "job failed: node 1 ('[^']*') lost: no heartbeat for" "$work/err" ||
    fail "the leader did not lose node 1, stopped for $held ms (status $rc)"
echo "# node 1's daemon stopped $held ms: $(grep -o "node 1 ('[^']*') lost: no heartbeat for [0-9]* ms" "$work/err" | head -n 1)"

# --- node 0's daemon stopped, while node 1's runs --------------------------------------------
stop_run leader 0 -N 2 "${hb[@]}"
[ "$rc" != 0 ] || fail "a job whose node 0 daemon was stopped for $held ms exited 0"
grep -q "node 1 lost the leader: no heartbeat for" "$work/err" ||
    fail "node 1 did not lose the leader, stopped for $held ms (status $rc)"
echo "# node 0's daemon stopped $held ms: $(grep -o "node 1 lost the leader: no heartbeat for [0-9]* ms" "$work/err" | head -n 1)"

# --- every process of a 2-node job stopped at once, as Slurm's suspend does ------------------
# Each rank says it is up and sleeps 2 s; then the daemons, the shims and the ranks are stopped
# for stop_ms and continued, the shims and ranks first (the worst order for a shim, which
# judges its agent's heartbeat pipe, and finds it empty until the agent runs again). No side
# may blame another for a pause that was its own.
job=$work/pause
# shellcheck disable=SC2016 # expanded by the ranks' shell
"$gpurun" --local -N 2 --job-dir "$job" "${hb[@]}" -- sh -c 'echo "up $RANK"; exec sleep 2' \
    >"$work/out" 2>"$work/err" </dev/null &
pid=$!
bg_pids+=("$pid")
wait_for_lines "$work/out" 2
mapfile -t daemons < <(pgrep -P "$pid")
shims=()
for d in "${daemons[@]}"; do
    mapfile -t -O "${#shims[@]}" shims < <(pgrep -P "$d" || true)
done
if [ "${#daemons[@]}" != 2 ] || [ "${#shims[@]}" != 2 ]; then
    fail "expected 2 daemons and 2 shims, found daemons '${daemons[*]}' and shims '${shims[*]}'"
fi
# A shim leads its rank's process group: the rank stops and continues with it.
groups=()
for s in "${shims[@]}"; do
    groups+=("-$s")
done
t0=$(date +%s%N)
stopped=("${daemons[@]}" "${groups[@]}")
kill -STOP -- "${stopped[@]}"
sleep "$((stop_ms / 1000)).$((stop_ms % 1000))"
kill -CONT -- "${groups[@]}"
kill -CONT -- "${daemons[@]}"
stopped=()
held=$((($(date +%s%N) - t0) / 1000000))
rc=0
wait "$pid" || rc=$?
expect_rc 0 "a 2-node job all of whose processes were stopped for $held ms (heartbeat timeout 1 s)"
! grep -q "no heartbeat\|has not answered" "$work/err" "$job"/logs/rank-*.log ||
    fail "a node or an agent was lost for a pause of the whole job"
echo "# whole 2-node job stopped $held ms under the hog: exit 0"
