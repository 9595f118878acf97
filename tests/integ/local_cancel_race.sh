#!/usr/bin/env bash
# A cancel whose signal reaches a rank before its daemon (as Slurm's scancel, a preemption or
# a requeue signals every process of the job step): rank 0 gets SIGTERM and dies of it, its
# node's rendezvousd gets SIGTERM a moment later. The job is recorded as cancelled, not as
# rank 0's failure (daemon/cancel.h), in summary.json and in the leader's log.
# timeout: 60
set -euo pipefail
# shellcheck source=local_common.sh
. "$(dirname "$0")/local_common.sh"

# Rank 1 ignores SIGTERM, so that the teardown after rank 0's death waits for --kill-grace:
# the daemon's own SIGTERM then comes while the job is still being torn down, as it does on
# Slurm, where the step's processes get the signal milliseconds apart.
# shellcheck disable=SC2016 # expanded by the ranks' shell
sleeper='[ "$RANK" = 1 ] && trap "" TERM; echo $$ >"$GPURUN_JOB_DIR/pid.$RANK"; echo up; exec sleep 60'
job=$work/job
"$gpurun" --local -N 1 --gpus-per-node 2 --kill-grace 2 --job-dir "$job" -- sh -c "$sleeper" \
    >"$work/out" 2>"$work/err" </dev/null &
pid=$!
bg_pids+=("$pid")
wait_for_lines "$work/out" 2
daemon=$(daemon_pid "$job" 0)
[ -n "$daemon" ] || fail "no rendezvousd of node 0"
kill -TERM "$(cat "$job/pid.0")"
sleep 0.2
kill -TERM "$daemon"
rc=0
wait "$pid" || rc=$?
fail_show=(out err)
echo "# gpurun exited $rc"
outcome=$(sed -n 's/^  "outcome": "\([a-z]*\)".*/\1/p' "$job/summary.json")
[ "$outcome" = cancelled ] ||
    fail "the job's outcome is '$outcome', not cancelled: $(grep -m1 '"cause"' "$job/summary.json")"
grep -q "job cancelled: node 0 ('.*') received SIGTERM (before it, rank 0 on node 0 ('.*') was killed by signal 15 (SIGTERM): the cancel's signal)" \
    "$work/err" || fail "the leader's log does not say the rank's death was the cancel's: $(grep -i 'cancel\|failed' "$work/err")"
echo "ok - a rank killed by the cancel's signal before its daemon: the job was cancelled"
