#!/bin/bash
# A stopped daemon (SIGSTOP) on the Slurm test cluster: a 2-node job whose node 1 rendezvousd
# is stopped; the leader loses it after the heartbeat timeout and fails the job, which then
# ends within a second of that verdict (a stopped daemon would keep srun, the batch script
# and gpurun --wait waiting: the batch script ends the step once the record is written, and
# Slurm's signal to the step ends the stopped daemon and its ranks). gpurun --wait exits 125,
# the record names node 1 (class node), and no process of the job is left.
# timeout: 240
# lane: side
set -euo pipefail
# shellcheck source=slurm_client_common.sh
. "$(dirname "$0")/slurm_client_common.sh"

bound_ms=3000

# shellcheck disable=SC2016 # expanded by each rank
timeout 60 "$gpurun" --wait -N 2 --gpus-per-node 1 --heartbeat 0.2 --heartbeat-timeout 2 \
    -- sh -c 'echo "up $RANK"; exec sleep 3013' >stop.out 2>stop.err </dev/null &
gpid=$!
id=
for ((i = 0; i < 150; i++)); do
    id=$(job_id stop.out)
    [ -n "$id" ] && break
    sleep 0.2
done
[ -n "$id" ] || grs_fail "no job id: $(cat stop.err)"
for ((i = 0; i < 150; i++)); do
    [ "$(grep -c '^\[[01]\] up ' stop.out)" = 2 ] && break
    sleep 0.2
done
[ "$(grep -c '^\[[01]\] up ' stop.out)" = 2 ] || grs_fail "the ranks did not start: $(tail -n 5 stop.err)"
victim=$(daemon_pid "$id" 1)
[ -n "$victim" ] || grs_fail "no rendezvousd of node 1"
kill -STOP "$victim"
rc=0
wait "$gpid" || rc=$?
end=$(date +%s%3N)
summary=$GPURUN_JOBS/$id/summary.json
[ "$rc" = 125 ] || grs_fail "--wait exited $rc, expected 125: $(tail -n 5 stop.err)"
[ -f "$summary" ] || grs_fail "no summary.json"
[ "$(json "$summary" '(v["first_failure"]["node"], v["first_failure"].get("class"))')" = "(1, 'node')" ] ||
    grs_fail "the record: $(json "$summary" 'v["first_failure"]')"
out=$GPURUN_JOBS/$id.out
line=$(grep -m1 "error: job failed: node 1 ('[^']*') lost: no heartbeat" "$out" || true)
[ -n "$line" ] || grs_fail "no verdict on node 1 in the batch output: $(tail -n 5 "$out")"
verdict=$(date -d "${line%%Z *}Z" +%s%3N)
echo "# the leader's verdict to gpurun --wait's return: $((end - verdict)) ms"
# --wait follows the job through slurmctld, which sees the batch script end a moment later.
[ $((end - verdict)) -lt "$bound_ms" ] ||
    grs_fail "--wait returned $((end - verdict)) ms after the leader's verdict, expected under $bound_ms: $(tail -n 8 "$out")"
for ((i = 0; i < 20; i++)); do
    ! kill -0 "$victim" 2>/dev/null && ! pgrep -f '^sleep 3013$' >/dev/null && break
    sleep 0.1
done
if pgrep -f '^sleep 3013$' >/dev/null || pgrep -f "rendezvousd --job-dir $GPURUN_JOBS/$id " >/dev/null; then
    grs_fail "processes left: $(pgrep -af "sleep 3013|$GPURUN_JOBS/$id ")"
fi
echo "ok - node 1's daemon stopped on Slurm: the job ended $((end - verdict)) ms after the verdict, nothing left"
