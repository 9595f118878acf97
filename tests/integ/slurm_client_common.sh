# Shared by the tests/integ/slurm_client_*.sh scripts (sourced, not run): brings up the Slurm
# test cluster (tests/slurm/up.sh; skips with exit 77 where it cannot run), points gpurun's
# job dirs at the scratch dir, and helpers to run gpurun and read its JSON. The cluster goes
# down when the script exits, whatever happened.
# shellcheck shell=bash

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=tests/slurm/lib.sh
. "$here/../slurm/lib.sh"

grs_test_begin gpurun rendezvousd "$@"
cd "$GRS_WORK"
gpurun=$GRS_BUILD/gpurun
# Job ids start from 1 on every fresh cluster: each test has job dirs of its own.
export GPURUN_JOBS=$GRS_WORK/jobs
# Debian's python, for reading JSON (the first python3 on PATH may be another).
py=/usr/bin/python3
[ -x "$py" ] || py=python3

# run OUT ERR ARGS...: gpurun ARGS with stdout in OUT and stderr in ERR, bounded in time;
# sets rc to its exit status.
run() {
    local out=$1 err=$2
    shift 2
    rc=0
    timeout 120 "$gpurun" "$@" >"$out" 2>"$err" </dev/null || rc=$?
}

# expect_rc WHAT WANT: fails with the output of the last run unless rc is WANT.
expect_rc() {
    [ "$rc" = "$2" ] || grs_fail "$1: exit status $rc, expected $2"
}

# job_id FILE: the id in FILE's "Submitted job N" line; "" while there is none, FILE itself
# included (a gpurun started in the background may not have opened it yet: under load the
# first poll comes first).
job_id() {
    [ -f "$1" ] || return 0
    sed -n 's/^Submitted job \([0-9][0-9]*\)$/\1/p' "$1" | head -n 1
}

# json FILE EXPR: prints the Python expression EXPR of the JSON in FILE (as v).
json() {
    "$py" -c 'import json, sys; v = json.load(open(sys.argv[1])); print(eval(sys.argv[2]))' "$1" "$2"
}

# wait_running ID N: waits (up to 30 s) until gpurun status says N ranks run.
wait_running() {
    local i
    for ((i = 0; i < 150; i++)); do
        run st.json st.err status "$1" --json
        if [ "$rc" = 0 ] && [ "$(json st.json '(v["progress"] or {}).get("running")')" = "$2" ]; then
            return 0
        fi
        sleep 0.2
    done
    grs_fail "job $1 did not get $2 running ranks within 30 s: $(tail -n 3 st.err)"
}

# daemon_pid ID NODE: the pid of node NODE's rendezvousd of job ID (its SLURM_NODEID).
daemon_pid() {
    local p
    for p in $(pgrep -f "^[^ ]*rendezvousd --job-dir $GPURUN_JOBS/$1 "); do
        if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "SLURM_NODEID=$2"; then
            echo "$p"
            return 0
        fi
    done
}

# job_field ID FIELD: FIELD of scontrol show job ID (JobState, Restarts, SubmitTime...).
job_field() {
    scontrol show job -o "$1" | tr ' ' '\n' | sed -n "s/^$2=//p"
}

# release ID: Slurm holds a requeued batch job back for 120 s (its credentials' lifetime);
# the test lets it start sooner, but not within 2 s of the requeue: the requeue revokes the
# old segment's credential on its nodes at a time in whole seconds, and slurmd refuses a
# launch credential no newer than that (the job then fails at once, exit 1, nothing run).
# The requeue sets the job's SubmitTime. The hold is set as the old segment's processes
# finish, maybe after the job reads PENDING, so the update is repeated until the job runs
# (120 s: slurmctld's scheduler is slow to act on a loaded machine). It has run again only
# once it was seen pending after the requeue: just after one, a loaded slurmctld may still
# show the old segment RUNNING with the new restart count.
release() {
    local i held="" since
    for ((i = 0; i < 600; i++)); do
        case $(job_field "$1" JobState) in
        PENDING)
            if [ "$(job_field "$1" Restarts)" -gt 0 ]; then
                held=1
                since=$(date -d "$(job_field "$1" SubmitTime)" +%s 2>/dev/null || echo 0)
                if ((i % 5 == 0 && $(date +%s) >= since + 2)); then
                    scontrol update "jobid=$1" StartTime=now
                fi
            fi
            ;;
        RUNNING | COMPLETED)
            [ -n "$held" ] && return 0
            ;;
        FAILED | CANCELLED | TIMEOUT | NODE_FAIL)
            [ -n "$held" ] && grs_fail "job $1 ended after its requeue: $(scontrol show job -o "$1")"
            ;;
        esac
        sleep 0.2
    done
    grs_fail "job $1 was not requeued and started again within 120 s: $(scontrol show job -o "$1")"
}
