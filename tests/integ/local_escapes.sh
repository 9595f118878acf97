#!/usr/bin/env bash
# Nothing a rank starts outlives its job: with a writable cgroup v2 each rank runs in a cgroup
# of its own, so a setsid'd (double-forked) descendant dies with the rank even after SIGKILL
# of its agent, and no cgroup is left; a frozen agent (SIGSTOP) has its ranks ended by their
# shims within the heartbeat timeout + 1 s; a normal job still exits 0 and leaves nothing.
# Without a writable cgroup v2 the daemon says so once and the frozen-agent part still runs;
# the script then skips.
# timeout: 120
set -euo pipefail
# shellcheck source=local_common.sh
. "$(dirname "$0")/local_common.sh"

# Each rank records its pid and that of a descendant in a session of its own (setsid, then
# a second fork so that it is nobody's child), says it is up, and sleeps.
# shellcheck disable=SC2016 # expanded by the ranks' shell
escaper='echo $$ >"$GPURUN_JOB_DIR/pid.$RANK"
setsid sh -c "sleep 60 & echo \$! >\"\$GPURUN_JOB_DIR/esc.\$RANK\"" </dev/null >/dev/null 2>&1
while [ ! -s "$GPURUN_JOB_DIR/esc.$RANK" ]; do sleep 0.01; done
echo up; exec sleep 60'

# alive PID: PID runs (a zombie does not count: it waits for a parent to reap it).
alive() {
    kill -0 "$1" 2>/dev/null && ! grep -q '^State:.*Z' "/proc/$1/status" 2>/dev/null
}

# ppid PID
ppid() {
    awk '{ print $4 }' "/proc/$1/stat"
}

# start NAME ARGS...: gpurun --local on 2 nodes of 2 ranks running $escaper, in the
# background; sets pid and job, and agent (node 1's daemon, the parent of rank 2's shim).
start() {
    local name=$1
    shift
    job=$work/$name
    : >"$work/out"
    "$gpurun" --local -N 2 --gpus-per-node 2 --kill-grace 1 --log-level info --job-dir "$job" \
        "$@" -- sh -c "$escaper" >"$work/out" 2>"$work/err" </dev/null &
    pid=$!
    bg_pids+=("$pid")
    wait_for_lines "$work/out" 4
    shim=$(ppid "$(cat "$job/pid.2")")
    agent=$(ppid "$shim")
}

# gone_within MS WHAT PIDS...: every PID is gone within MS ms; prints how long it took.
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

# no_cgroup_left DAEMON_PID: the daemon's job cgroup is gone.
no_cgroup_left() {
    [ -z "$cgroot" ] && return 0
    [ ! -e "$cgroot/gpurun-$1" ] || fail "cgroup '$cgroot/gpurun-$1' left: $(ls "$cgroot/gpurun-$1")"
}

# --- SIGKILL of node 1's daemon: its ranks and their setsid'd descendants are gone at once.
start kill
cgroot=
# Rank 2's cgroup, from its own /proc entry (its shim, a warm one, got its --cgroup through
# a pipe, not on its command line): DIR/gpurun-AGENT/rank-2 in the cgroup v2 hierarchy.
rel=$(sed -n 's/^0:://p' "/proc/$(cat "$job/pid.2")/cgroup")
mnt=$(findmnt -t cgroup2 -n -o TARGET | head -n 1)
if [ -n "$mnt" ] && [[ $rel == */gpurun-"$agent"/rank-2 ]]; then
    cg=$mnt$rel
    cgroot=${cg%/gpurun-*}
    echo "# ranks run in cgroups under '$cgroot'"
else
    grep -q 'ranks run without cgroups of their own' "$work/err" ||
        fail "no --cgroup for the shim and no message saying why"
    [ "$(grep -c 'ranks run without cgroups of their own' "$work/err")" = 2 ] ||
        fail "expected the no-cgroup message once per daemon (2), got: $(grep -c 'without cgroups' "$work/err")"
    echo "# $(grep -m1 'ranks run without cgroups' "$work/err")"
fi
esc=$(cat "$job/esc.2" "$job/esc.3")
alive "${esc%%$'\n'*}" || fail "rank 2's setsid'd descendant is not running before the kill"
kill -KILL "$agent"
if [ -n "$cgroot" ]; then
    # shellcheck disable=SC2086 # one pid a word
    gone_within 2000 "after SIGKILL of node 1's daemon, its ranks and their setsid'd descendants" \
        "$(cat "$job/pid.2")" "$(cat "$job/pid.3")" $esc
    echo "# SIGKILL of the daemon: ranks and setsid'd descendants gone after $took ms"
    no_cgroup_left "$agent"
else
    gone_within 2000 "after SIGKILL of node 1's daemon, its ranks" \
        "$(cat "$job/pid.2")" "$(cat "$job/pid.3")"
fi
rc=0
wait "$pid" || rc=$?
[ "$rc" != 0 ] || fail "a job whose daemon was killed exited 0"
if [ -n "$cgroot" ]; then
    # shellcheck disable=SC2046 # one pid a word
    gone_within 2000 "after the job's end, every rank and descendant" $(cat "$job"/pid.* "$job"/esc.*)
fi

# --- SIGSTOP of node 1's daemon: its shims end their ranks within the heartbeat timeout.
start stop --heartbeat 0.1 --heartbeat-timeout 1
kill -STOP "$agent"
pids=("$(cat "$job/pid.2")" "$(cat "$job/pid.3")")
[ -n "$cgroot" ] && pids+=("$(cat "$job/esc.2")" "$(cat "$job/esc.3")")
gone_within 2000 "after SIGSTOP of node 1's daemon (heartbeat timeout 1 s), its ranks" "${pids[@]}"
echo "# SIGSTOP of the daemon: its ranks gone after $took ms (heartbeat timeout 1000 ms)"
# gpurun may have continued and ended it already (below).
kill -CONT "$agent" 2>/dev/null || true
rc=0
wait "$pid" || rc=$?
[ "$rc" != 0 ] || fail "a job whose daemon was frozen exited 0"
# Rank 2's log says why it ended. Two ends race, both right: its shim's, once the agent has
# been silent for the heartbeat timeout (the shim's word goes through the daemon, which
# writes it once it runs again), and the daemon's teardown, once gpurun has continued and
# ended the daemon the leader gave up after the same timeout.
if grep -q "the agent (pid $agent) has not answered for" "$job/logs/rank-2.log"; then
    echo "# rank 2 ended by its shim"
elif grep -q "^----- gpurun: .*: the rank is ended: .*SIGTERM -----$" "$job/logs/rank-2.log"; then
    echo "# rank 2 ended by its daemon's teardown (the leader's verdict came first)"
else
    fail "rank 2's log does not say why it was ended: $(cat "$job/logs/rank-2.log")"
fi
# shellcheck disable=SC2046 # one pid a word
gone_within 3000 "after the frozen job's end, every rank" $(cat "$job"/pid.*)
no_cgroup_left "$agent"

# --- A normal job: exit 0, nothing of it left.
job=$work/normal
# shellcheck disable=SC2016 # expanded by the ranks' shell
run --local -N 2 --gpus-per-node 2 --job-dir "$job" -- sh -c \
    'setsid sh -c "sleep 60 & echo \$! >\"\$GPURUN_JOB_DIR/esc.\$RANK\"" </dev/null >/dev/null 2>&1
while [ ! -s "$GPURUN_JOB_DIR/esc.$RANK" ]; do sleep 0.01; done
awk "{ print \$4 }" /proc/$PPID/stat >"$GPURUN_JOB_DIR/agent.$RANK"; echo "rank $RANK ok"'
expect_rc 0 "a normal job"
expect_out_line "[3] rank 3 ok"
# shellcheck disable=SC2046 # one pid a word
gone_within 1000 "after a normal job, the ranks' setsid'd descendants" $(cat "$job"/esc.*)
for f in "$job"/agent.*; do
    no_cgroup_left "$(cat "$f")"
done
echo "# a normal job: exit 0, nothing left"
[ -n "$cgroot" ] || skip "no writable cgroup v2 here: setsid'd descendants of a killed daemon not checked"
