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
