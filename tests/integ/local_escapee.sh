#!/usr/bin/env bash
# Nothing outlives its job, not even a process that leaves every hierarchy's cgroups: a root
# rank's child that starts a session of its own (setsid) and writes its pid into the root
# cgroup.procs of every cgroup hierarchy is in neither its rank's process group nor its
# cgroup, yet it carries the job mark (GPURUN_JOB_MARK) of its rank, and:
#   - SIGKILL of its daemon: the rank's shim sweeps the mark, the escapee is gone at once;
#   - SIGSTOP of its daemon: the shim does so after the heartbeat timeout, and says so;
#   - SIGKILL of its daemon and its shims together: gpurun --local sweeps the job's mark once
#     the daemons are gone, and says how many it ended;
#   - SIGKILL of every daemon and every shim while gpurun is stopped: the next daemon's start
#     sweeps the marks of daemons that are gone;
#   - a restart: the agent sweeps before generation 1 starts.
# Needs root (a root cgroup.procs is root's to write).
# timeout: 120
set -euo pipefail
# shellcheck source=local_common.sh
. "$(dirname "$0")/local_common.sh"

[ "$(id -u)" = 0 ] || skip "not root: only root can move a process into a root cgroup"

# The root cgroup.procs of every mounted hierarchy (v1 and v2), as this machine shows them.
roots=$(awk '$0 ~ / - cgroup2? / { print $5 "/cgroup.procs" }' /proc/self/mountinfo | sort -u |
    tr '\n' ' ')
[ -n "$roots" ] || echo "# no cgroup hierarchy mounted: the escapee leaves its process group only"
echo "# escapes into: $roots"

# Each rank records its pid, starts the escapee (a session of its own, then into every root
# cgroup, recording its pid once there) and sleeps. The escapee's sleep bounds its life if
# everything else fails.
# shellcheck disable=SC2016 # expanded by the ranks' shell
escaper='echo $$ >"$GPURUN_JOB_DIR/pid.$RANK"
setsid sh -c "for f in '"$roots"'; do echo \$\$ >\"\$f\" || exit 1; done
echo \$\$ >\"\$GPURUN_JOB_DIR/esc.\$RANK\"; exec sleep 60" </dev/null >/dev/null 2>&1 &
while [ ! -s "$GPURUN_JOB_DIR/esc.$RANK" ]; do sleep 0.01; done
echo up; exec sleep 60'

# alive PID: PID runs (a zombie does not count).
alive() {
    kill -0 "$1" 2>/dev/null && ! grep -q '^State:.*Z' "/proc/$1/status" 2>/dev/null
}

ppid() {
    awk '{ print $4 }' "/proc/$1/stat"
}

# Every process left is killed at exit, whatever the outcome: escapees are nobody's children.
leftovers=()
# keep PID...: PID is killed at exit if it still runs then, as the same process (its start
# time): a pid freed meanwhile may be another's on a shared machine.
keep() {
    local p
    for p in "$@"; do
        leftovers+=("$p:$(awk '{ print $22 }' "/proc/$p/stat" 2>/dev/null || true)")
    done
}
kill_leftovers() {
    local e now
    for e in "${leftovers[@]}"; do
        now=$(awk '{ print $22 }' "/proc/${e%%:*}/stat" 2>/dev/null || true)
        if [ -n "${e#*:}" ] && [ "$now" = "${e#*:}" ]; then
            kill -KILL "${e%%:*}" 2>/dev/null || true
        fi
    done
}
exit_hooks+=(kill_leftovers)

# start NAME ARGS...: gpurun --local on 2 nodes of 2 ranks running $escaper, in the
# background; sets pid (gpurun's), job, agent0 and agent1 (the daemons), shims (node 1's)
# and esc (the escapees, ranks 0-3).
start() {
    local name=$1 r
    shift
    job=$work/$name
    : >"$work/out"
    "$gpurun" --local -N 2 --gpus-per-node 2 --kill-grace 1 --log-level info --job-dir "$job" \
        "$@" -- sh -c "$escaper" >"$work/out" 2>"$work/err" </dev/null &
    pid=$!
    bg_pids+=("$pid")
    wait_for_lines "$work/out" 4
    esc=()
    for r in 0 1 2 3; do
        esc+=("$(cat "$job/esc.$r")")
        keep "$(cat "$job/pid.$r")" "${esc[$r]}"
    done
    shims=("$(ppid "$(cat "$job/pid.2")")" "$(ppid "$(cat "$job/pid.3")")")
    agent1=$(ppid "${shims[0]}")
    agent0=$(ppid "$(ppid "$(cat "$job/pid.0")")")
    for r in 0 1 2 3; do
        escaped "${esc[$r]}"
    done
}

# escaped PID: PID runs, in a session of its own and, where a cgroup v2 is mounted, in its
# root cgroup (the "0::/" line), as the escapee means to.
escaped() {
    alive "$1" || fail "escapee $1 is not running"
    [ "$(awk '{ print $6 }' "/proc/$1/stat")" = "$1" ] || fail "escapee $1 leads no session"
    if grep -q '^0::' "/proc/$1/cgroup"; then
        grep -qx '0::/' "/proc/$1/cgroup" ||
            fail "escapee $1 did not reach the root cgroup: $(cat "/proc/$1/cgroup")"
    fi
}

# gone_within MS WHAT PIDS...: every PID is gone within MS ms; sets took.
gone_within() {
    local ms=$1 what=$2 t0 p left
    shift 2
    t0=$(date +%s%N)
    while :; do
        left=()
        for p in "$@"; do
            alive "$p" && left+=("$p")
        done
        [ "${#left[@]}" = 0 ] && break
        took=$((($(date +%s%N) - t0) / 1000000))
        [ "$took" -lt "$ms" ] || fail "$what: pids ${left[*]} still running after $took ms"
        sleep 0.02
    done
    took=$((($(date +%s%N) - t0) / 1000000))
}

# --- SIGKILL of node 1's daemon: its escapees are gone at once (their shims sweep).
start daemon
kill -KILL "$agent1"
gone_within 2000 "after SIGKILL of node 1's daemon, its ranks' escapees" "${esc[2]}" "${esc[3]}"
echo "# SIGKILL of the daemon: its ranks' escapees gone after $took ms"
rc=0
wait "$pid" || rc=$?
[ "$rc" != 0 ] || fail "a job whose daemon was killed exited 0"
gone_within 2000 "after the job's end, every escapee" "${esc[@]}"
echo "# the job's end: node 0's escapees gone too"

# --- SIGSTOP of node 1's daemon: its shims judge it frozen after the heartbeat timeout, end
# their ranks and sweep, and say how many they ended in the rank's log.
start stop --heartbeat 0.1 --heartbeat-timeout 1
kill -STOP "$agent1"
gone_within 3000 "after SIGSTOP of node 1's daemon (heartbeat timeout 1 s), its ranks' escapees" \
    "${esc[2]}" "${esc[3]}"
echo "# SIGSTOP of the daemon: its ranks' escapees gone after $took ms (heartbeat timeout 1000 ms)"
# gpurun may have continued and ended it already (below).
kill -CONT "$agent1" 2>/dev/null || true
rc=0
wait "$pid" || rc=$?
[ "$rc" != 0 ] || fail "a job whose daemon was frozen exited 0"
# Two ends race, both right (local_escapes.sh says more): the shims', which count what they
# swept in the rank's log, and, once gpurun has continued the daemon the leader gave up after
# the same timeout, the daemon's teardown, whose sweep its own log counts.
if grep -q '^gpurun: ended 1 process of the rank outside its process group and cgroup$' \
    "$job/logs/rank-2.log"; then
    echo "# rank 2's escapee swept by its shim"
elif grep -q "^----- gpurun: .*: the rank is ended: .*SIGTERM -----$" "$job/logs/rank-2.log" &&
    grep -q "rendezvousd\[$agent1\] info: killing process ${esc[2]} left behind by a rank" "$work/err"; then
    echo "# rank 2's escapee swept by its daemon's teardown (the leader's verdict came first)"
elif grep -q "^----- gpurun: .*: the rank is ended: lost the leader: .* -----$" \
    "$job/logs/rank-2.log"; then
    # A third order of the same race: continued, the daemon finds its link closed (the
    # leader gave it up) before gpurun's SIGTERM, and its log holds no count. The escapee
    # was gone while the daemon was stopped (above): only the rank's shim can have ended it.
    echo "# rank 2's escapee ended by its shim while the daemon was stopped (no count in its log)"
else
    fail "neither rank 2's log nor its daemon's counts its escapee: $(cat "$job/logs/rank-2.log")"
fi

# --- SIGKILL of node 1's daemon and its shims at once: nobody on node 1 is left to sweep, and
# gpurun does once the daemons are gone.
start shims
# Stopped first, so that none of them acts on the others' deaths.
kill -STOP "$agent1" "${shims[@]}"
kill -KILL "$agent1" "${shims[@]}"
rc=0
wait "$pid" || rc=$?
[ "$rc" != 0 ] || fail "a job whose daemon and shims were killed exited 0"
gone_within 1000 "after gpurun's end, node 1's ranks and escapees" \
    "$(cat "$job/pid.2")" "$(cat "$job/pid.3")" "${esc[2]}" "${esc[3]}"
# gpurun sweeps them once the daemons are gone, unless node 0's daemon, sweeping the job's
# mark as it ends, found them first (on one machine the nodes' processes share the mark).
if grep -q '^gpurun: ended [0-9]* process\(es\)\{0,1\} of job .* still running after its daemons' "$work/err"; then
    echo "# $(grep '^gpurun: ended' "$work/err")"
elif grep -q "info: killing process \($(cat "$job/pid.2")\|$(cat "$job/pid.3")\|${esc[2]}\|${esc[3]}\) left behind by a rank" "$work/err"; then
    echo "# node 0's daemon swept node 1's processes first"
else
    fail "gpurun does not say it ended what its daemons left: $(cat "$work/err")"
fi

# --- SIGKILL of both daemons and every shim while gpurun is stopped (^Z): the ranks and
# escapees run on, carrying the mark of daemons that are gone (zombies gpurun has not reaped
# yet), until the next daemon starts.
start all
all_shims=("$(ppid "$(cat "$job/pid.0")")" "$(ppid "$(cat "$job/pid.1")")" "${shims[@]}")
kill -STOP "$pid" "$agent0" "$agent1" "${all_shims[@]}"
kill -KILL "$agent0" "$agent1" "${all_shims[@]}"
marked=()
for r in 0 1 2 3; do
    marked+=("$(cat "$job/pid.$r")" "${esc[$r]}")
done
sleep 0.2
for p in "${marked[@]}"; do
    alive "$p" || fail "process $p ended with its daemons (all that could end it was killed)"
done
# A process whose mark names a daemon that still runs (this script, started now) is spared.
GPURUN_JOB_MARK="0000000000000000/$$/$(awk '{ print $22 }' /proc/$$/stat)/0" sleep 60 &
spared=$!
keep "$spared"
run --local --log-level info --job-dir "$work/next" -- true
expect_rc 0 "the next job"
gone_within 1000 "after the next job's start, the ranks and escapees of the killed one" \
    "${marked[@]}"
alive "$spared" || fail "a process whose mark names a running daemon was ended"
grep -q 'ended [0-9]* process\(es\)\{0,1\} carrying the job mark of daemons that are gone' "$work/err" ||
    echo "# (another daemon's start swept them first)"
echo "# the next daemon's start: $(grep -m1 'carrying the job mark of daemons' "$work/err" || true)"
kill -CONT "$pid"
rc=0
wait "$pid" || rc=$?
[ "$rc" != 0 ] || fail "a job whose daemons were killed exited 0"

# --- A restart: what generation 0 left outside its groups and cgroups is gone before
# generation 1 runs (a process holding a GPU or a port would meet the next generation).
# shellcheck disable=SC2016 # expanded by the ranks' shell
run --local --gpus-per-node 2 --max-restarts 1 --kill-grace 1 --job-dir "$work/restart" -- sh -c '
if [ "$GPURUN_RESTART_COUNT" = 0 ]; then
    setsid sh -c "for f in '"$roots"'; do echo \$\$ >\"\$f\" || exit 1; done
echo \$\$ >\"\$GPURUN_JOB_DIR/gen0.\$RANK\"; exec sleep 60" </dev/null >/dev/null 2>&1 &
    while [ ! -s "$GPURUN_JOB_DIR/gen0.$RANK" ]; do sleep 0.01; done
    [ "$RANK" = 1 ] && kill -KILL $$
    exec sleep 60
fi
for f in "$GPURUN_JOB_DIR"/gen0.*; do
    p=$(cat "$f")
    if [ -e "/proc/$p" ] && ! grep -q "^State:.*Z" "/proc/$p/status"; then echo "gen0 left $p"; fi
done
echo "generation 1 ran"'
for f in "$work/restart"/gen0.*; do
    keep "$(cat "$f")"
done
expect_rc 0 "a job restarted after a SIGKILL in generation 0"
expect_out_line "[0] generation 1 ran"
! grep -q 'gen0 left' "$work/out" ||
    fail "generation 0's escapees ran on into generation 1: $(grep 'gen0 left' "$work/out")"
echo "# a restart: generation 0's escapees gone before generation 1"
