#!/usr/bin/env bash
# `gpurun status` of a running local job: the leader found through endpoint.json, the
# authenticated query answered with the live view (job id, state, world size, a row per node
# and per rank), as text and as JSON, by --job-dir and by JOBID; a wrong key refused.
# timeout: 120
set -euo pipefail
# shellcheck source=local_common.sh
. "$(dirname "$0")/local_common.sh"

"$gpurun" --local -N 2 --gpus-per-node 2 --kill-grace 1 -- sh -c 'echo up; exec sleep 60' \
    >"$work/job.out" 2>"$work/job.err" </dev/null &
pid=$!
bg_pids+=("$pid")
wait_for_lines "$work/job.out" 4
jobs=("$HOME"/.gpurun/jobs/local-*)
dir=${jobs[0]}
id=${dir##*/}
[ -f "$dir/endpoint.json" ] || fail "no endpoint.json in '$dir' while the job runs"

run status --job-dir "$dir"
expect_rc 0 "gpurun status --job-dir"
expect_out_line "job: $id (sh)"
expect_out_line "state: RUNNING"
expect_out_line "ranks: 4 running, 0 exited, 0 joined, 0 pending (of 4)"
grep -qE '^rank +node +host +phase +step' "$work/out" || fail "status shows no rank table"
for r in 0 1 2 3; do
    grep -qE "^$r +$((r / 2)) +[^ ]+ +running " "$work/out" ||
        fail "status shows no running rank $r on node $((r / 2))"
done

run status "$id" --json
expect_rc 0 "gpurun status JOBID --json"
grep -qF "\"job_id\": \"$id\"" "$work/out" || fail "status --json lacks the job id"
grep -qF '"world_size": 4' "$work/out" || fail "status --json lacks the world size"

# Another key in a copy of the job dir: the leader does not prove this key, and the client
# says so instead of trusting it.
mkdir -m 700 "$work/fake"
cp "$dir/endpoint.json" "$dir/job.json" "$work/fake/"
(umask 077 && head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$work/fake/key")
run status --job-dir "$work/fake"
expect_rc 125 "status with another job's key"
grep -q "does not hold this job's key" "$work/err" || fail "no message for a wrong key"

kill -TERM "$pid"
rc=0
wait "$pid" || rc=$?
expect_rc 143 "gpurun after SIGTERM"
run status --job-dir "$dir"
expect_rc 0 "status after the job"
grep -qE '^outcome: (cancelled|failed)$' "$work/out" || fail "status after SIGTERM shows no outcome"
echo "# live status by job dir and id, text and JSON, wrong key refused"
