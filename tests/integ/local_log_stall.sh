#!/usr/bin/env bash
# The daemons' own log never stops their loops: a rank floods its stderr into gpurun's stderr,
# a pipe whose reader sleeps 10 s, so that the pipe is full; then SIGUSR1 to gpurun makes every
# daemon log a line (the pre-timeout signal, at --log-level info). A record written straight to
# the full pipe would block the daemon until the reader woke, and with a 2 s heartbeat
# timeout node 1 would be lost; queued with the ranks' lines it costs nothing, and the job
# ends well.
# timeout: 90
set -euo pipefail
# shellcheck source=local_common.sh
. "$(dirname "$0")/local_common.sh"

# shellcheck disable=SC2016 # expanded by the ranks' shell
timeout -k 5 60 "$gpurun" --local -N 2 --heartbeat 0.2 --heartbeat-timeout 2 --log-level info \
    --job-dir "$work/job" -- sh -c '[ "$RANK" = 1 ] && { yes "flood from rank 1" >&2 & }; sleep 6; exit 0' \
    2> >(
        sleep 10
        cat >"$work/err"
    ) >"$work/out" </dev/null &
gp=$!
bg_pids+=("$gp")
sleep 2.5
kill -USR1 "$(pgrep -P "$gp" -x gpurun)"
rc=0
wait "$gp" || rc=$?
pkill -f "yes flood from rank 1" 2>/dev/null || true
[ "$rc" = 0 ] || fail "the job exited $rc, not 0: $(/usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["first_failure"]["cause"])' "$work/job/summary.json" 2>/dev/null)"
outcome=$(/usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["outcome"])' "$work/job/summary.json")
[ "$outcome" = completed ] || fail "outcome '$outcome'"
echo "# a full stderr pipe and a logged signal: no daemon stalled, the job completed"
