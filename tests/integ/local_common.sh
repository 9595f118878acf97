# Shared by the tests/integ/local_*.sh scripts (sourced, not run): the prologue (prologue.sh:
# root, build, work, skip, fail, bg_pids stopped at exit), gpurun, a HOME of its own in the
# scratch dir (so default job dirs land in it), and helpers that run gpurun and check what it
# did. Needs the real build: a script skips (exit 77) when gpurun or rendezvousd is not built.
# shellcheck shell=bash

# shellcheck source=prologue.sh
. "$(dirname "${BASH_SOURCE[0]}")/prologue.sh"

gpurun=$build/gpurun
# A bound on every gpurun run: these jobs take well under a second; a hang fails the test
# with a message instead of running into the runner's timeout.
GPURUN_LIMIT=${GPURUN_LIMIT:-60}

need_built gpurun rendezvousd
export HOME=$work/home
mkdir -p "$HOME"

# run ARGS...: runs gpurun ARGS with stdout in $work/out and stderr in $work/err; sets rc.
run() {
    rc=0
    timeout -k 5 "$GPURUN_LIMIT" "$gpurun" "$@" >"$work/out" 2>"$work/err" </dev/null || rc=$?
}

# expect_rc N WHAT: the last run exited with N.
expect_rc() {
    [ "$rc" = "$1" ] || fail "$2: exit status $rc, expected $1"
}

# expect_err TEXT: the last run's stderr has TEXT on a line of its own.
expect_err() {
    grep -qxF -- "$1" "$work/err" || fail "stderr lacks the line '$1'"
}

# expect_out_line LINE: the last run's stdout has LINE exactly.
expect_out_line() {
    grep -qxF -- "$1" "$work/out" || fail "stdout lacks the line '$1'"
}

# wait_for_lines FILE N: waits (up to 10 s) until FILE has at least N lines.
wait_for_lines() {
    local i
    for ((i = 0; i < 200; i++)); do
        [ -f "$1" ] && [ "$(wc -l <"$1")" -ge "$2" ] && return 0
        sleep 0.05
    done
    fail "'$1' did not reach $2 lines in 10 s"
}

# mode_of PATH: the permission bits in octal ("700").
mode_of() {
    stat -c %a "$1"
}

# wait_job_id ERRFILE: waits (up to 10 s) for gpurun's "gpurun: job ID, job dir ..." line in
# ERRFILE and prints ID ("" when none came). For a gpurun started in the background, whose
# ERRFILE may not even exist yet.
wait_job_id() {
    local i id=
    for ((i = 0; i < 100; i++)); do
        id=$(sed -n 's/^gpurun: job \([^,]*\), job dir .*/\1/p' "$1" 2>/dev/null || true)
        [ -n "$id" ] && break
        sleep 0.1
    done
    echo "$id"
}

# daemon_pid DIR K: the pid of node K's rendezvousd of the job in DIR ("" when none).
daemon_pid() {
    local p
    for p in $(pgrep -f -- "--node-rank $2( |$)" || true); do
        if tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | grep -qF -- "$1"; then
            echo "$p"
            return 0
        fi
    done
}
