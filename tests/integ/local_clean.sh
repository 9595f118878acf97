#!/usr/bin/env bash
# gpurun clean and the job list: `gpurun status` without a JOBID shows the 20 most recent
# jobs and says how many it left out (--all: every one); `gpurun clean` removes ended jobs'
# dirs (--older-than: only those that ended long enough ago; --dry-run: nothing), keeps a
# running job's, never removes a --job-dir outside the jobs root (its link goes once the dir
# is gone), and refuses a JOBID.
# timeout: 120
set -euo pipefail
# shellcheck source=local_common.sh
. "$(dirname "$0")/local_common.sh"

export GPURUN_JOBS=$work/jobs
for _ in $(seq 22); do
    run --local -- true
    expect_rc 0 "a job of 'true'"
done
# The list: 20 rows under the header, then the note; --all: 22.
"$gpurun" status >"$work/list" 2>&1 || fail "status: $(cat "$work/list")"
[ "$(grep -c '^local-' "$work/list")" = 20 ] || fail "status listed $(grep -c '^local-' "$work/list") jobs, want 20"
grep -qx "(2 older jobs not shown: gpurun status --all)" "$work/list" || fail "no note of the 2 left out: $(tail -n 2 "$work/list")"
"$gpurun" status --all >"$work/list" 2>&1 || fail "status --all: $(cat "$work/list")"
[ "$(grep -c '^local-' "$work/list")" = 22 ] || fail "status --all listed $(grep -c '^local-' "$work/list") jobs, want 22"
! grep -q 'not shown' "$work/list" || fail "status --all left some out"

# One ended job is old (its summary 10 days back), one job runs, one ran with --job-dir
# outside the root (the root holds a link to it).
old=
for d in "$GPURUN_JOBS"/local-*; do
    old=${d##*/}
    break
done
touch -d '10 days ago' "$GPURUN_JOBS/$old/summary.json"
"$gpurun" --local -- sleep 30 >"$work/long.out" 2>"$work/long.err" </dev/null &
bg_pids+=($!)
# The shell may not have opened long.err yet.
wait_for_lines "$work/long.err" 1
running=
for ((i = 0; i < 100; i++)); do
    running=$(sed -n 's/^gpurun: job \([^,]*\), job dir .*/\1/p' "$work/long.err")
    [ -n "$running" ] && break
    sleep 0.1
done
[ -n "$running" ] || fail "the long job did not start"
run --local --job-dir "$work/mine" -- true
expect_rc 0 "a job with --job-dir outside the root"
mine=$(sed -n 's/^gpurun: job \([^,]*\), job dir .*/\1/p' "$work/err")
[ -L "$GPURUN_JOBS/$mine" ] || fail "no link to the outside job dir in the root"

"$gpurun" clean --older-than 5 --dry-run >"$work/clean" 2>&1 || fail "clean --dry-run: $(cat "$work/clean")"
[ "$(grep -c "^would remove '$GPURUN_JOBS/local-" "$work/clean")" = 1 ] ||
    fail "clean --older-than 5 --dry-run: $(cat "$work/clean")"
grep -qF "would remove '$GPURUN_JOBS/$old' (COMPLETED, " "$work/clean" || fail "not the old job: $(cat "$work/clean")"
[ -d "$GPURUN_JOBS/$old" ] || fail "--dry-run removed the old job"
"$gpurun" clean --older-than 5 >"$work/clean" 2>&1 || fail "clean --older-than 5: $(cat "$work/clean")"
[ ! -e "$GPURUN_JOBS/$old" ] || fail "the old job's dir is still there"
grep -qE "^removed 1 job dir and 0 links, [0-9.]+ KiB; kept 1 pending or running, 21 ended 5 days ago or later$" "$work/clean" ||
    fail "clean's last line: $(tail -n 1 "$work/clean")"

"$gpurun" clean >"$work/clean" 2>&1 || fail "clean: $(cat "$work/clean")"
[ -d "$GPURUN_JOBS/$running" ] || fail "the running job's dir was removed"
if [ ! -d "$work/mine" ] || [ ! -L "$GPURUN_JOBS/$mine" ]; then
    fail "the outside job dir or its link was removed"
fi
[ "$(find "$GPURUN_JOBS" -mindepth 1 -maxdepth 1 | wc -l)" = 2 ] ||
    fail "left in the root: $(ls "$GPURUN_JOBS")"
rm -rf "$work/mine"
"$gpurun" clean >"$work/clean" 2>&1 || fail "clean: $(cat "$work/clean")"
grep -qxF "removed the link '$GPURUN_JOBS/$mine' (its job dir is gone)" "$work/clean" ||
    fail "the dangling link: $(cat "$work/clean")"
run clean 1234
expect_rc 125 "gpurun clean 1234"
grep -qF "gpurun clean takes no job: unexpected argument '1234'" "$work/err" || fail "$(cat "$work/err")"
echo "# status lists 20 of 22 and says so; clean removed ended jobs only, by age, kept the running one and the outside dir"
