#!/bin/bash
# Every command says what it did, with the real `gpurun --local`: status of a running local
# job and the list show its elapsed time (not "-"); gpurun cancel ID says it cancelled; gpurun
# logs without an id shows the newest job's, and says which; gpurun rerun of a local job runs
# it again (a new job, in its working directory, the same options) and says the command,
# and refuses one that still runs.
# timeout: 120
set -euo pipefail
# shellcheck source=local_common.sh
. "$(dirname "$0")/local_common.sh"

dur='[0-9]+:[0-9]{2}:[0-9]{2}'

# A running job: its elapsed time in status and the list.
"$gpurun" --local --kill-grace 1 -- sh -c 'echo up; exec sleep 60' >"$work/a.out" 2>"$work/a.err" </dev/null &
pid=$!
bg_pids+=("$pid")
wait_for_lines "$work/a.out" 1
a=$(wait_job_id "$work/a.err")
[ -n "$a" ] || fail "no job id: $(cat "$work/a.err")"
sleep 1.1
run status "$a"
expect_rc 0 "gpurun status of a running local job"
grep -qE "^elapsed: $dur\$" "$work/out" || fail "status of a running local job: no elapsed line: $(head -n 4 "$work/out")"
[ "$(sed -n 's/^elapsed: //p' "$work/out")" != 0:00:00 ] || fail "a job running for 1 s has elapsed 0:00:00"
run status
expect_rc 0 "gpurun status (the list)"
grep -qE "^$a +[^ ]+ +RUNNING +[^ ]+ +$dur " "$work/out" ||
    fail "the list lacks job $a's elapsed time: $(cat "$work/out")"
run status "$a" --json
[ "$(python3 -c 'import json, sys; print(type(json.load(open(sys.argv[1]))["elapsed_s"]).__name__)' "$work/out")" = int ] ||
    fail "status --json: elapsed_s is not a number"

# gpurun rerun of a job that runs is refused.
run rerun "$a"
expect_rc 125 "gpurun rerun of a running local job"
expect_err "gpurun: job '$a' is running: only a job that has ended runs again (gpurun cancel $a first, or wait for its end)"

# gpurun cancel says it did.
run cancel "$a"
expect_rc 0 "gpurun cancel"
expect_err "gpurun: job $a cancelled"
wait "$pid" || true

# An ended job (a name of its own, an --export, another working directory).
mkdir -p "$work/here"
# shellcheck disable=SC2016 # expanded by the rank
(cd "$work/here" && "$gpurun" --local --gpus-per-node 2 -J second --export 'GREETING=hi there' -- \
    sh -c 'echo "$GREETING from $(pwd)"' >"$work/b.out" 2>"$work/b.err" </dev/null) ||
    fail "the second job: $(cat "$work/b.err")"
b=$(wait_job_id "$work/b.err")
run status "$b"
grep -qE "^elapsed: $dur\$" "$work/out" || fail "status of an ended local job: no elapsed line"

# gpurun logs without an id: the newest job's.
run logs
expect_rc 0 "gpurun logs without an id"
expect_err "gpurun: job $b, the newest (gpurun status lists the others)"
expect_out_line "[0] hi there from $work/here"

# gpurun rerun of a local job runs it again.
run rerun "$b"
expect_rc 0 "gpurun rerun of a local job"
# shellcheck disable=SC2016 # the command's own words
expect_err "gpurun: running local job '$b' again: cd $work/here && gpurun --local --gpus-per-node 2 --export 'GREETING=hi there' -J second -- sh -c 'echo \"\$GREETING from \$(pwd)\"'"
[ "$(grep -c "^\[[01]\] hi there from $work/here\$" "$work/out")" = 2 ] ||
    fail "the job run again printed: $(cat "$work/out")"
c=$(wait_job_id "$work/err")
if [ -z "$c" ] || [ "$c" = "$b" ]; then
    fail "the job run again has no id of its own: '$c'"
fi
run status "$c"
expect_out_line "job: $c (second)"
echo "# cancel, logs (the newest), rerun of a local job, elapsed of local jobs"
