#!/bin/bash
# The time limit on the Slurm test cluster, with Slurm's own pre-timeout signal: two 1-minute
# jobs side by side. A prepared Python rank (gpurun.on_preempt) gets the signal 15 s before
# the limit, checkpoints and exits 0: COMPLETED. An unprepared one never sees it (Python's
# default action for SIGUSR1 is to exit), runs to the limit and is stopped there: TIMEOUT,
# gpurun --wait exits 124, summary.json says timeout.
# timeout: 240
# lane: side
set -euo pipefail
# shellcheck source=slurm_client_common.sh
. "$(dirname "$0")/slurm_client_common.sh"

python=$py
rank=$(cd "$here/../.." && pwd)/tests/ranks/preempt_rank.py

t0=$(grs_now_ms)
rc_u=0
rc_p=0
timeout 200 "$gpurun" --wait -N 1 --gpus-per-node 2 -t 1 -J unprepared -- "$python" "$rank" unprepared \
    >u.out 2>u.err </dev/null &
pid_u=$!
timeout 200 "$gpurun" --wait -N 1 --gpus-per-node 2 -t 1 -J prepared -- "$python" "$rank" prepared \
    >p.out 2>p.err </dev/null &
pid_p=$!
wait "$pid_p" || rc_p=$?
ms_p=$(($(grs_now_ms) - t0))
wait "$pid_u" || rc_u=$?
ms_u=$(($(grs_now_ms) - t0))
echo "# prepared: exit $rc_p after $ms_p ms; unprepared: exit $rc_u after $ms_u ms"

# The prepared job: the signal, a checkpoint per rank, exit 0 well before the limit.
[ "$rc_p" = 0 ] || grs_fail "the prepared job exited $rc_p: $(tail -n 20 p.out)"
id_p=$(job_id p.out)
for r in 0 1; do
    grep -qxF "[$r] rank $r: pre-timeout signal 10" p.out || grs_fail "prepared rank $r got no signal"
    grep -q "^step " "$GPURUN_JOBS/$id_p/ckpt-$r" || grs_fail "prepared rank $r wrote no checkpoint"
done
[ "$ms_p" -lt 58000 ] || grs_fail "the prepared job ended after $ms_p ms, not before its limit"
run st.json st.err status "$id_p" --json
[ "$(json st.json 'v["state"], v["summary"]["outcome"]')" = "('COMPLETED', 'completed')" ] ||
    grs_fail "prepared job: $(json st.json 'v["state"], v["summary"]')"

# The unprepared job: ran to the limit, never signalled, TIMEOUT and 124.
[ "$rc_u" = 124 ] || grs_fail "the unprepared job exited $rc_u, not 124: $(tail -n 20 u.out)"
id_u=$(job_id u.out)
[ "$ms_u" -ge 60000 ] || grs_fail "the unprepared job ended after $ms_u ms, before its 1-minute limit"
grep -q "pre-timeout signal SIGUSR1 to 0 of 2 ranks" u.out ||
    grs_fail "the unprepared job's daemon did not say it kept the signal back: $(tail -n 20 u.out)"
run st.json st.err status "$id_u" --json
[ "$(json st.json 'v["state"], v["exit_status"]')" = "('TIMEOUT', 124)" ] ||
    grs_fail "unprepared job: $(json st.json 'v["state"], v["exit_status"]')"
[ "$(json st.json 'v["summary"]["outcome"], v["summary"]["exit_status"]')" = "('timeout', 124)" ] ||
    grs_fail "unprepared job's summary: $(json st.json 'v["summary"]')"
run st.txt st.err status "$id_u"
grep -q "^state: TIMEOUT" st.txt || grs_fail "status text: $(head -n 3 st.txt)"
echo "# prepared: checkpointed on the pre-timeout signal, COMPLETED; unprepared: TIMEOUT, 124"
