#!/usr/bin/env bash
# Stragglers: a rank whose steps take twice the others' is named in gpurun status, the log,
# summary.json and the metrics (gpurun_rank_step_seconds of the node's file, and the leader's
# gpurun_node_straggler and gpurun_rank_straggler_ratio); under a barrier every step (data
# parallelism's lockstep) the rank whose own work is slow is named from its step_time, not
# the ranks that wait for it; --straggler-threshold 0 names none.
# timeout: 120
set -euo pipefail
# shellcheck source=local_common.sh
. "$(dirname "$0")/local_common.sh"

py=/usr/bin/python3
[ -x "$py" ] || py=python3

cat >"$work/free.py" <<EOF
import os, sys, time
sys.path.insert(0, "$root/lib/rank/python")
import gpurun
slow = 0.08 if gpurun.rank() == 2 else 0.04
for step in range(1, int(os.environ.get("STEPS", "150")) + 1):
    time.sleep(slow)
    gpurun.report(step)
EOF
cat >"$work/lockstep.py" <<EOF
import sys, time
sys.path.insert(0, "$root/lib/rank/python")
import gpurun
own = 0.08 if gpurun.rank() == 1 else 0.03
for step in range(1, 41):
    t0 = time.monotonic()
    time.sleep(own)
    took = time.monotonic() - t0
    gpurun.barrier("step%d" % step, timeout=30)
    gpurun.report(step, step_time=took)
EOF

field() {
    "$py" -c 'import json, sys; d = json.load(open(sys.argv[1])); print(eval(sys.argv[2]))' \
        "$1/summary.json" "$2"
}

# --- free-running ranks: rank 2 at half speed ----------------------------------------------
job=$work/free
mkdir -p "$work/m"
timeout -k 5 60 "$gpurun" --local --gpus-per-node 3 --job-dir "$job" --metrics-dir "$work/m" \
    -- "$py" "$work/free.py" >"$work/out" 2>"$work/err" </dev/null &
gp=$!
bg_pids+=("$gp")
seen=
for ((i = 0; i < 80; i++)); do
    if "$gpurun" status --job-dir "$job" >"$work/st" 2>&1 &&
        grep -qE '^straggler: rank 2 on node 0 \(.*\) [0-9]+% slower than the median over [0-9]+ steps' "$work/st"; then
        seen=1
        break
    fi
    sleep 0.1
done
[ -n "$seen" ] || fail "gpurun status never named rank 2: $(cat "$work/st")"
[ "$(grep -c '^straggler:' "$work/st")" = 1 ] ||
    fail "status names more than rank 2: $(grep straggler "$work/st")"
step0='' step2=''
# The metrics files are rewritten every 5 s.
for ((i = 0; i < 150; i++)); do
    step0=$(sed -n 's/^gpurun_rank_step_seconds{.*rank="0"} //p' "$work"/m/*.prom 2>/dev/null | head -n 1)
    step2=$(sed -n 's/^gpurun_rank_step_seconds{.*rank="2"} //p' "$work"/m/*.prom 2>/dev/null | head -n 1)
    [ -n "$step0" ] && [ -n "$step2" ] && break
    sleep 0.1
done
[ -n "$step2" ] ||
    fail "no gpurun_rank_step_seconds in the metrics: $(cat "$work"/m/*.prom 2>/dev/null | tail -n 3)"
awk -v a="$step0" -v b="$step2" 'BEGIN { exit !(b > 1.5 * a) }' ||
    fail "metrics: rank 2's step $step2 s is not well above rank 0's $step0 s"
# The leader's own file: node 0 has a straggler, rank 2's ratio.
for ((i = 0; i < 50; i++)); do
    grep -qs '^gpurun_rank_straggler_ratio{.*rank="2"} [0-9.]' "$work"/m/*_leader.prom && break
    sleep 0.1
done
grep -qs '^gpurun_node_straggler{.*node="0".*} 1$' "$work"/m/*_leader.prom ||
    fail "no gpurun_node_straggler of node 0: $(cat "$work"/m/*_leader.prom 2>/dev/null)"
grep -qs '^gpurun_rank_straggler_ratio{.*rank="2"} [0-9.]' "$work"/m/*_leader.prom ||
    fail "no gpurun_rank_straggler_ratio of rank 2"
wait "$gp" || fail "the job failed: $(tail -n 5 "$work/err")"
if ls "$work"/m/*_leader.prom >/dev/null 2>&1; then
    fail "the leader's metrics file outlived the job"
fi
grep -q "straggler: rank 2 on node 0 ('.*') [0-9]*% slower than the median" "$work/err" ||
    fail "no log line for the straggler: $(grep -i strag "$work/err")"
[ "$(field "$job" "[s['rank'] for s in d['stragglers']]")" = "[2]" ] ||
    fail "summary.json stragglers: $(field "$job" "d.get('stragglers')")"
echo "# a rank at half speed: named in status, log, summary.json and metrics"

# --- lockstep: the slow rank's own work names it --------------------------------------------
job=$work/lockstep
run --local --gpus-per-node 3 --job-dir "$job" -- "$py" "$work/lockstep.py"
expect_rc 0 "the lockstep job"
grep -q "straggler: rank 1 on node 0" "$work/err" ||
    fail "lockstep: rank 1 not named: $(grep -i strag "$work/err")"
[ "$(grep -c 'straggler: rank' "$work/err")" = 1 ] ||
    fail "lockstep: the waiting ranks named too: $(grep 'straggler: rank' "$work/err")"
echo "# lockstep: the rank whose own work is slow is named, not those that wait"

# --- threshold 0: none ---------------------------------------------------------------------
job=$work/off
STEPS=30 run --local --gpus-per-node 3 --job-dir "$job" --straggler-threshold 0 -- "$py" "$work/free.py"
expect_rc 0 "the job without the stragglers rule"
if grep -q "straggler:" "$work/err"; then
    fail "--straggler-threshold 0 still named one"
fi
[ "$(field "$job" "d.get('stragglers')")" = None ] || fail "stragglers in summary.json with the rule off"
echo "# --straggler-threshold 0: no straggler"
