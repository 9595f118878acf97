#!/usr/bin/env bash
# The job dir of a local job: made under ~/.gpurun/jobs/<id>/ unless --job-dir says where,
# private (dir and logs/ 0700, key and job.json 0600), job.json holding what gpurun was told;
# then `gpurun logs` and `gpurun status` reading it after the job, by JOBID and by --job-dir.
# timeout: 120
set -euo pipefail
# shellcheck source=local_common.sh
. "$(dirname "$0")/local_common.sh"

umask 022
# shellcheck disable=SC2016 # expanded by the ranks' shell
run --local --gpus-per-node 2 --kill-grace 1.5 --heartbeat 0.2 --export A=1 \
    -- sh -c 'echo "hello from $RANK"; echo "bye from $RANK"'
expect_rc 0 "a job in the default job dir"

jobs=("$HOME"/.gpurun/jobs/local-*)
if [ ${#jobs[@]} != 1 ] || [ ! -d "${jobs[0]}" ]; then
    fail "no single job dir under ~/.gpurun/jobs: ${jobs[*]}"
fi
dir=${jobs[0]}
id=${dir##*/}
[[ $id =~ ^local-[0-9]{8}-[0-9]{6}-[0-9]+$ ]] || fail "job id '$id' is not local-YYYYmmdd-HHMMSS-PID"

[ "$(mode_of "$dir")" = 700 ] || fail "job dir mode $(mode_of "$dir"), not 700"
[ "$(mode_of "$dir/logs")" = 700 ] || fail "logs/ mode $(mode_of "$dir/logs"), not 700"
[ "$(mode_of "$dir/key")" = 600 ] || fail "key mode $(mode_of "$dir/key"), not 600"
[ "$(mode_of "$dir/job.json")" = 600 ] || fail "job.json mode $(mode_of "$dir/job.json"), not 600"
grep -qE '^[0-9a-f]{64}$' "$dir/key" || fail "the key is not 64 hex digits"
for want in "\"job_id\": \"$id\"" '"loopback": true' '"nprocs": 2' '"nnodes": 1' \
    '"kill_grace_ms": 1500' '"hb_interval_ms": 200' '"hb_timeout_ms": 2000' '"A=1"' '"sh"'; do
    grep -qF -- "$want" "$dir/job.json" || fail "job.json lacks $want"
done
[ -f "$dir/summary.json" ] || fail "no summary.json after the job"

# logs: every rank's lines, prefixed, each rank's in the order written; the ranks' lines are
# merged by the time they were written, which two ranks running at once do not fix: the
# interleaving is not checked, each rank's own order is.
run logs "$id"
expect_rc 0 "gpurun logs JOBID"
printf '[0] bye from 0\n[0] hello from 0\n[1] bye from 1\n[1] hello from 1\n' >"$work/want"
sort "$work/out" | cmp -s "$work/want" - ||
    fail "gpurun logs printed other lines than $(cat "$work/want"): $(cat "$work/out")"
for r in 0 1; do
    [ "$(grep -F "[$r] " "$work/out" | tr '\n' '|')" = "[$r] hello from $r|[$r] bye from $r|" ] ||
        fail "gpurun logs: rank $r's lines out of their order: $(cat "$work/out")"
done
# Where the order in time is known, the merge follows it: rank 1 writes half a second before
# rank 0, and its line comes first.
# shellcheck disable=SC2016 # expanded by the ranks' shell
run --local --gpus-per-node 2 --job-dir "$work/timed" \
    -- sh -c '[ "$RANK" = 0 ] && sleep 0.5; echo "line of $RANK"'
expect_rc 0 "a job whose rank 1 writes first"
run logs --job-dir "$work/timed"
printf '[1] line of 1\n[0] line of 0\n' >"$work/want"
cmp -s "$work/want" "$work/out" || fail "gpurun logs did not merge by time: $(cat "$work/out")"
run logs --job-dir "$dir" --rank 1
expect_rc 0 "gpurun logs --rank 1"
printf 'hello from 1\nbye from 1\n' >"$work/want"
cmp -s "$work/want" "$work/out" || fail "gpurun logs --rank 1 printed something else"
run logs --job-dir "$dir" --rank 7
expect_rc 125 "gpurun logs --rank 7"
grep -q "no log of rank 7" "$work/err" || fail "no message for a rank without a log"

# status after the end: the summary.
run status "$id"
expect_rc 0 "gpurun status JOBID"
expect_out_line "job: $id (sh)"
expect_out_line "state: COMPLETED, exit status 0"
expect_out_line "outcome: completed"
run status --job-dir "$dir" --json
expect_rc 0 "gpurun status --json"
grep -qF '"outcome": "completed"' "$work/out" || fail "status --json lacks the outcome"
run status local-no-such-job
expect_rc 125 "status of an unknown job"
grep -q "no job 'local-no-such-job'" "$work/err" || fail "no message for an unknown job"

# --job-dir: made where asked (parents too), private whatever the umask.
umask 000
run --local --job-dir "$work/a/b/job" -- true
umask 022
expect_rc 0 "--job-dir"
[ "$(mode_of "$work/a/b/job")" = 700 ] || fail "--job-dir mode $(mode_of "$work/a/b/job") under umask 000"
[ "$(mode_of "$work/a/b/job/key")" = 600 ] || fail "key mode $(mode_of "$work/a/b/job/key") under umask 000"
run --local --job-dir "$work/a/b/job" -- true
expect_rc 125 "a job dir used twice"

# A failed job's status names the failure.
run --local --job-dir "$work/failed" -- sh -c 'echo last words; exit 9'
expect_rc 9 "a failing job"
run status --job-dir "$work/failed"
expect_rc 0 "status of a failed job"
expect_out_line "outcome: failed"
expect_out_line "state: FAILED, exit status 9"
grep -qE "^first failure \(user-error\): rank 0 on node 0 \('.*'\) exited with status 9$" "$work/out" ||
    fail "status does not name the failing rank once: $(grep '^first failure' "$work/out")"
grep -qxF "  last words" "$work/out" || fail "status does not show the failing rank's last lines"
echo "# job dir modes, job.json, logs and status after the job ok"
