#!/usr/bin/env bash
# One record when the machine refuses processes: gpurun --local with 40 nodes of 2 ranks in a
# pids cgroup that allows 60, 100 or 130 tasks. Daemons, their threads or the ranks' processes
# cannot start; the job ends. Its exit status (125: gpurun's, never 126, "cannot execute"),
# its first line of cause and summary.json must agree: the record is "failed", 125, of class
# node, naming a node and saying what could not start (a fork refused is said as such), not
# the SIGTERM gpurun then sent (kept as leader_first_failure). The first error line names its
# node; no join is called "after the job started" when no rank did. A rank's fork refused is
# the node's failure, which --max-restarts restarts. No process of the job is left.
# timeout: 150
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

nap=40.$$
# row MAX ARGS...: the 40-node job under pids.max MAX with gpurun ARGS; checks the record.
row() {
    local max=$1 job=$work/job-$1 got first i
    shift
    echo "$max" >"$cg/pids.max"
    rc=0
    (
        echo "$BASHPID" >"$cg/cgroup.procs"
        exec timeout -k 5 60 "$gpurun" --local --nodes 40 --gpus-per-node 2 --job-dir "$job" \
            "$@" -- sleep "$nap"
    ) >"$work/out" 2>"$work/err" </dev/null || rc=$?
    cp "$work/err" "$work/err-$max"
    [ "$rc" = 125 ] || fail "pids.max $max: exit status $rc, expected 125: $(grep -v '^\[' "$work/err" | head -n 5)"
    first=$(grep -v '^\[' "$work/err" | grep -m1 ' error: \|^gpurun: cannot' || true)
    [[ $first =~ node\ [0-9]+ ]] || fail "pids.max $max: the first error line names no node: '$first'"
    ! grep -q "cannot execute" "$work/err" || fail "pids.max $max: a fork refused called 'cannot execute': $(grep -m1 'cannot execute' "$work/err")"
    ! grep -q "join after the job started\|joined after the job started" "$work/err" ||
        fail "pids.max $max: a join 'after the job started' when no rank did: $(grep -m1 'after the job started' "$work/err")"
    case $(grep '^gpurun: ' "$work/err" | sed -n 2p) in
    *"cannot start"* | *"cannot fork"* | *"failed (exit status 125); stopping the job"* | *"exited with status 125"*) ;;
    *) fail "pids.max $max: gpurun's first line of cause: '$(grep '^gpurun: ' "$work/err" | sed -n 2p)'" ;;
    esac
    [ -f "$job/summary.json" ] || fail "pids.max $max: no summary.json"
    got=$(/usr/bin/python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); f=j["first_failure"]
c=f["cause"]
print(j["outcome"], j["exit_status"], f.get("class"), "SIGTERM" not in c and any(w in c for w in ("cannot start", "cannot fork", "could not start", "failed (exit status 125)")), "leader_first_failure" in j or j.get("recorded_by") == "gpurun" or j.get("recorded_by") is None)' \
        "$job/summary.json")
    [ "$got" = "failed 125 node True True" ] ||
        fail "pids.max $max: summary outcome, exit_status, class, cause names the start, leader's kept: $got ($(grep '"cause"' "$job/summary.json" | head -n 2))"
    for ((i = 0; i < 50; i++)); do
        pgrep -f "sleep $nap\$" >/dev/null || break
        sleep 0.1
    done
    ! pgrep -f "sleep $nap\$" >/dev/null || fail "pids.max $max: ranks left: $(pgrep -af "sleep $nap\$")"
    echo "# pids.max $max, 40 nodes: exit 125, class node, summary: $(grep -m1 '"cause"' "$job/summary.json")"
}

row 60
row 100
row 130 --max-restarts 1
# Where a rank's fork was refused (at 130 the daemons start and their ranks cannot all), the
# failure is the node's: said as a fork, and restarted as --max-restarts allows.
job=$work/job-130
if /usr/bin/python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); sys.exit(0 if any("could not start: gpurun: cannot fork" in f["cause"] for f in j["earlier_failures"] + [j["first_failure"]]) else 1)' \
    "$job/summary.json"; then
    [ "$(/usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["restarts"])' "$job/summary.json")" = 1 ] ||
        fail "a rank's fork refused was not restarted under --max-restarts 1: $(grep -v '^\[' "$work/err-130" | tail -n 5)"
    echo "# a rank's fork refused: class node, restarted once"
fi
