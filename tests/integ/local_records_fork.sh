#!/usr/bin/env bash
# One record when the machine refuses processes: gpurun --local with 40 nodes of 2 ranks in a
# pids cgroup that allows 60 tasks. Daemons or their threads cannot start; gpurun stops the
# job. Its exit status (125), its first line of cause and summary.json must agree: the record
# is "failed", 125, naming a node that could not start, not the SIGTERM gpurun then sent (kept
# as leader_first_failure). No process of the job is left.
# timeout: 90
set -euo pipefail
# shellcheck source=local_common.sh
. "$(dirname "$0")/local_common.sh"

pids_root=
for d in /sys/fs/cgroup/pids /sys/fs/cgroup; do
    if [ -f "$d/cgroup.procs" ] && { [ -f "$d/pids.max" ] || [ -d "$d/pids" ] || [ "$d" = /sys/fs/cgroup/pids ]; }; then
        pids_root=$d
        break
    fi
done
[ -n "$pids_root" ] || skip "no pids cgroup controller mounted"
cg=$pids_root/gpurun-test-fork-$$
mkdir "$cg" 2>/dev/null || skip "cannot make a cgroup under '$pids_root'"
cg_remove() {
    rmdir "$cg" 2>/dev/null || true
}
exit_hooks+=(cg_remove)
[ -f "$cg/pids.max" ] || skip "the cgroup under '$pids_root' has no pids.max"
echo 60 >"$cg/pids.max"

nap=40.$$
rc=0
(
    echo "$BASHPID" >"$cg/cgroup.procs"
    exec timeout -k 5 60 "$gpurun" --local --nodes 40 --gpus-per-node 2 --job-dir "$work/job" \
        -- sleep "$nap"
) >"$work/out" 2>"$work/err" </dev/null || rc=$?
[ "$rc" = 125 ] || fail "exit status $rc, expected 125: $(grep -v '^\[' "$work/err" | head -n 5)"
first=$(grep '^gpurun: ' "$work/err" | sed -n 2p)
case $first in
*"cannot start"* | *"failed (exit status 125); stopping the job"*) ;;
*) fail "gpurun's first line of cause: '$first'" ;;
esac
[ -f "$work/job/summary.json" ] || fail "no summary.json"
got=$(/usr/bin/python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); f=j["first_failure"]
print(j["outcome"], j["exit_status"], "SIGTERM" not in f["cause"] and ("cannot start" in f["cause"] or "failed (exit status 125)" in f["cause"]), "leader_first_failure" in j or j.get("recorded_by") == "gpurun")' \
    "$work/job/summary.json")
[ "$got" = "failed 125 True True" ] ||
    fail "summary outcome, exit_status, cause names the start, leader's kept: $got ($(grep cause "$work/job/summary.json" | head -n 2))"
for ((i = 0; i < 50; i++)); do
    pgrep -f "sleep $nap\$" >/dev/null || break
    sleep 0.1
done
! pgrep -f "sleep $nap\$" >/dev/null || fail "ranks left: $(pgrep -af "sleep $nap\$")"
echo "# pids.max 60, 40 nodes: exit 125, summary: $(grep -m1 '"cause"' "$work/job/summary.json")"
