#!/bin/bash
# Nothing outlives its job on the Slurm test cluster either: each rank of a 2-node job starts
# an escapee that leaves its session (setsid), its parentage (a double fork: Slurm's
# proctrack/linuxproc follows parents) and every cgroup hierarchy its node can reach (its pid
# into each root cgroup.procs; the test cluster's nodes mount over /sys/fs/cgroup, so none
# there). SIGKILL of node 1's rendezvousd: the ranks' shims sweep the job mark and the
# escapees are gone at once (before, they ran on past the job's end); the job ends and node
# 0's are gone too. Then node 1's rendezvousd and its shims killed together: what they leave
# is swept by the next rendezvousd that starts.
# timeout: 180
# lane: side
set -euo pipefail
[ "$(id -u)" = 0 ] || {
    echo "# SKIP not root: only root can move a process into a root cgroup"
    exit 77
}
# shellcheck source=slurm_client_common.sh
. "$(dirname "$0")/slurm_client_common.sh"

# Every escapee and rank is killed at exit whatever happened: nobody else would.
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
end_test() {
    local rc=$?
    kill_leftovers
    (exit "$rc")
    grs_test_end
}
trap end_test EXIT

# The escapee, in the shared scratch dir: it leaves for the root of every cgroup hierarchy its
# node lists, records its pid and sleeps.
cat >"$GRS_WORK/escape.sh" <<'EOF'
for f in $(awk '$0 ~ / - cgroup2? / { print $5 "/cgroup.procs" }' /proc/self/mountinfo); do
    echo $$ >"$f"
done
echo $$ >"$GPURUN_JOB_DIR/esc.$RANK"
exec sleep 3021
EOF
# Each rank records its pid, starts the escapee in a session of its own, orphaned at once (a
# child of the agent, a subreaper, then of nobody once the agent dies), and sleeps.
# shellcheck disable=SC2016 # expanded by the ranks' shell
escaper='echo $$ >"$GPURUN_JOB_DIR/pid.$RANK"
setsid sh -c "sh '"$GRS_WORK/escape.sh"' &" </dev/null >/dev/null 2>"$GPURUN_JOB_DIR/escerr.$RANK"
while [ ! -s "$GPURUN_JOB_DIR/esc.$RANK" ]; do sleep 0.01; done
echo up; exec sleep 3022'

alive() {
    kill -0 "$1" 2>/dev/null && ! grep -q '^State:.*Z' "/proc/$1/status" 2>/dev/null
}

# gone_within MS WHAT PIDS...: every PID is gone within MS ms; sets took.
gone_within() {
    local ms=$1 what=$2 t0 p left
    shift 2
    t0=$(grs_now_ms)
    while :; do
        left=()
        for p in "$@"; do
            alive "$p" && left+=("$p")
        done
        [ "${#left[@]}" = 0 ] && break
        took=$(($(grs_now_ms) - t0))
        [ "$took" -lt "$ms" ] || grs_fail "$what: pids ${left[*]} still running after $took ms"
        sleep 0.05
    done
    took=$(($(grs_now_ms) - t0))
}

# start: a 2-node job of 2 ranks a node running $escaper; sets id, dir, pids and esc (by
# rank), and agent1 (node 1's rendezvousd).
start() {
    local r i
    run sub.out sub.err -N 2 --gpus-per-node 2 --kill-grace 1 -- sh -c "$escaper"
    expect_rc "gpurun" 0
    id=$(job_id sub.out)
    dir=$GPURUN_JOBS/$id
    for ((i = 0; i < 600; i++)); do
        [ "$(cat "$dir"/esc.* 2>/dev/null | wc -l)" = 4 ] && break
        sleep 0.1
    done
    [ "$(cat "$dir"/esc.* 2>/dev/null | wc -l)" = 4 ] ||
        grs_fail "job $id: not 4 escapees within 60 s: $(ls "$dir" 2>&1; scontrol show job -o "$id")"
    pids=()
    esc=()
    for r in 0 1 2 3; do
        pids+=("$(cat "$dir/pid.$r")")
        esc+=("$(cat "$dir/esc.$r")")
        keep "${pids[$r]}" "${esc[$r]}"
        grep -qx '0::/' "/proc/${esc[$r]}/cgroup" || ! grep -q '^0::' "/proc/${esc[$r]}/cgroup" ||
            grs_fail "escapee of rank $r is not in the root cgroup: $(cat "/proc/${esc[$r]}/cgroup")"
    done
    # Hierarchies its node lists but mounts over cannot be reached: said, not failed.
    [ ! -s "$dir/escerr.0" ] ||
        echo "# the escapee of rank 0 could not reach $(wc -l <"$dir/escerr.0") hierarchies: $(head -n 1 "$dir/escerr.0")"
    agent1=$(daemon_pid "$id" 1)
    [ -n "$agent1" ] || grs_fail "no rendezvousd of node 1 for job $id"
}

# --- SIGKILL of node 1's rendezvousd: its ranks' shims end the escapees at once.
start
kill -KILL "$agent1"
gone_within 3000 "after SIGKILL of node 1's rendezvousd, its ranks' escapees" "${esc[2]}" "${esc[3]}"
echo "# SIGKILL of node 1's rendezvousd: its ranks' escapees gone after $took ms"
state=$(grs_job_wait "$id" 60) || grs_fail "job $id did not end within 60 s"
[ "$state" != COMPLETED ] || grs_fail "job $id, whose rendezvousd was killed, COMPLETED"
gone_within 3000 "after job $id's end ($state), every rank and escapee" "${pids[@]}" "${esc[@]}"
echo "# the job's end ($state): node 0's escapees gone too"

# --- Node 1's rendezvousd and its shims killed together (stopped first, so that none acts on
# another's death): nobody of the job is left on node 1 to sweep. The job ends; what is left
# runs until the next rendezvousd's start.
start
shims=("$(awk '{ print $4 }' "/proc/${pids[2]}/stat")" "$(awk '{ print $4 }' "/proc/${pids[3]}/stat")")
kill -STOP "$agent1" "${shims[@]}"
kill -KILL "$agent1" "${shims[@]}"
state=$(grs_job_wait "$id" 60) || grs_fail "job $id did not end within 60 s"
left=()
for p in "${pids[2]}" "${pids[3]}" "${esc[2]}" "${esc[3]}"; do
    alive "$p" && left+=("$p")
done
echo "# node 1's rendezvousd and shims killed: job $id $state, ${#left[@]} of node 1's ranks and escapees left running"
run next.out next.err --wait -N 2 --gpus-per-node 1 -- true
expect_rc "the next job" 0
gone_within 3000 "after the next job, what the killed job left" "${pids[@]}" "${esc[@]}"
echo "# the next job's rendezvousd swept them"
