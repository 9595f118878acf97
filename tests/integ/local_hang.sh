#!/usr/bin/env bash
# Hang detection with --hang-timeout on native ranks (the rank library's reports): a rank
# that stops reporting while the others wait for it is found within hang_timeout + 1 s, it
# is the one blamed (not the ranks waiting), every rank's stack is captured (eu-stack or
# gdb) into its log and summary.json before the teardown, and the job ends with 124. A job
# whose ranks never report runs to completion under --hang-timeout, with one warning.
# timeout: 120
set -euo pipefail
# shellcheck source=local_common.sh
. "$(dirname "$0")/local_common.sh"

example=$build/tests/gr_example
[ -x "$example" ] || skip "'$example' is not built"
py=/usr/bin/python3
[ -x "$py" ] || py=python3

# json FILE EXPR: the Python expression EXPR of the JSON in FILE (as v).
json() {
    "$py" -c 'import json, sys; v = json.load(open(sys.argv[1])); print(eval(sys.argv[2]))' "$1" "$2"
}

# --- a stalled rank among four on two nodes -------------------------------------------------
# Rank 2 stops before reporting step 3; the others report all 30 steps (100 ms apart), then
# wait for it at a barrier. Their reports stop too, but later: rank 2's is the oldest.
hang=1.5
job=$work/hung
t0=$(date +%s%N)
run --local -N 2 --gpus-per-node 2 --hang-timeout "$hang" --kill-grace 1 --job-dir "$job" \
    -- "$example" --steps 30 --step-ms 100 --stall-rank 2 --stall-step 3
ms=$((($(date +%s%N) - t0) / 1000000))
expect_rc 124 "a job with a hung rank"
sum=$job/summary.json
[ -f "$sum" ] || fail "no summary.json"
[ "$(json "$sum" 'v["outcome"]')" = hung ] || fail "outcome $(json "$sum" 'v["outcome"]'), not hung"
[ "$(json "$sum" 'v["first_failure"]["rank"]')" = 2 ] ||
    fail "blamed rank $(json "$sum" 'v["first_failure"]["rank"]'), not the stalled rank 2"
cause=$(json "$sum" 'v["first_failure"]["cause"]')
[[ $cause == "rank 2 on node 1 "*"hung: no progress report for "* ]] || fail "cause '$cause'"
grep -qF "error: job failed: rank 2 on node 1" "$work/err" || fail "no failure line naming rank 2"
# Found within hang_timeout + 1 s of its last report: the cause says how long it had been.
age=$(sed -n 's/.*no progress report for \([0-9.]*\) s.*/\1/p' <<<"$cause")
awk -v a="$age" -v h="$hang" 'BEGIN { exit !(a >= h && a <= h + 1) }' ||
    fail "detected after ${age:-?} s without a report, not within ${hang} + 1 s"
secs=$(json "$sum" 'round((v["timings"]["total_ms"]) / 1000.0, 1)')
echo "# hung rank 2 blamed $age s after its last report (timeout $hang s); job over after $ms ms (leader: $secs s)"
[ "$ms" -lt 12000 ] || fail "the hang took $ms ms to end the job"
# Every rank's stack: in summary.json, and in the rank's log.
tool=eu-stack
command -v eu-stack >/dev/null || tool=gdb
if command -v "$tool" >/dev/null; then
    for r in 0 1 2 3; do
        st=$(json "$sum" "v['ranks'][$r].get('stack') or ''")
        [ -n "$st" ] || fail "summary.json has no stack for rank $r"
        grep -qF -- "--- stack of rank $r " "$job/logs/rank-$r.log" ||
            fail "rank $r's log lacks its stack"
    done
    st=$(json "$sum" 'v["first_failure"].get("stack") or ""')
    grep -qE 'pause|report_steps' <<<"$st" ||
        fail "the blamed rank's stack does not show where it stalled: $st"
    echo "# stacks of all 4 ranks captured by $tool"
else
    echo "# no eu-stack or gdb here: stacks not checked"
fi
# gpurun status of the ended job shows the blamed rank's stack.
"$gpurun" status --job-dir "$job" >"$work/st.out" 2>&1 || true
if command -v "$tool" >/dev/null; then
    grep -qF "stack of rank 2" "$work/st.out" ||
        fail "gpurun status does not show the blamed rank's stack: $(head -c 600 "$work/st.out")"
fi

# --- ranks that never report: never called hung ----------------------------------------------
run --local --gpus-per-node 2 --hang-timeout 0.5 -- sh -c 'sleep 2; echo done'
expect_rc 0 "a job whose ranks never report, under --hang-timeout 0.5"
[ "$(grep -c 'done' "$work/out")" = 2 ] || fail "the ranks did not run to the end"
[ "$(grep -c 'cannot apply: no rank has reported progress' "$work/err")" = 1 ] ||
    fail "not exactly one 'cannot apply' warning: $(grep -c 'cannot apply' "$work/err")"
echo "# ranks that never report ran 2 s under --hang-timeout 0.5, one warning"

# --- a rank stuck before its first report ----------------------------------------------------
# The others report, then wait for it at a barrier: the rank that never got there is blamed,
# not a waiting one.
job=$work/silent
run --local -N 2 --gpus-per-node 2 --hang-timeout 1 --kill-grace 1 --job-dir "$job" \
    -- "$example" --steps 10 --step-ms 50 --stall-rank 2 --stall-step 0
expect_rc 124 "a job with a rank stuck before its first report"
cause=$(json "$job/summary.json" 'v["first_failure"]["cause"]')
[ "$(json "$job/summary.json" 'v["first_failure"]["rank"]')" = 2 ] ||
    fail "blamed rank $(json "$job/summary.json" 'v["first_failure"]["rank"]'), not rank 2 (stuck before its first report): $cause"
[[ $cause == "rank 2 on node 1 "*"hung: it never reported progress while the others wait for it"* ]] ||
    fail "the cause does not say why rank 2: $cause"
# Its row in gpurun status says so; the ranks that reported show how long ago.
"$gpurun" status --job-dir "$job" >"$work/st.out" 2>&1 || true
[ "$(grep -c 'no reports' "$work/st.out")" = 1 ] ||
    fail "status does not mark exactly one rank 'no reports': $(cat "$work/st.out")"
grep -E '^ *2 ' "$work/st.out" | grep -qF 'no reports' ||
    fail "rank 2's status row lacks 'no reports': $(grep -E '^ *2 ' "$work/st.out")"
echo "# a rank stuck before its first report is named in the cause"

# --- a rank that starts late, Python --------------------------------------------------------
# Rank 2 sleeps 8 s before its first report; the others report, then wait in gpurun.barrier()
# (first job) or in something gpurun cannot see, a sleep standing for a collective (second
# job). --hang-timeout 3: the late rank is blamed both times.
root=$(cd "$(dirname "$0")/../.." && pwd)
cat >"$work/late.py" <<EOF
import os, sys, time
sys.path.insert(0, "$root/lib/rank/python")
import gpurun
if gpurun.rank() == 2:
    time.sleep(8)
for step in range(3):
    gpurun.report(step, loss=1.0)
    time.sleep(0.05)
if sys.argv[1] == "barrier":
    gpurun.barrier("after-steps", timeout=60)
else:
    time.sleep(60)
EOF
for mode in barrier unseen; do
    job=$work/late-$mode
    run --local -N 2 --gpus-per-node 2 --hang-timeout 3 --kill-grace 1 --job-dir "$job" \
        -- "$py" "$work/late.py" "$mode"
    expect_rc 124 "a job with a late rank ($mode)"
    cause=$(json "$job/summary.json" 'v["first_failure"]["cause"]')
    [ "$(json "$job/summary.json" 'v["first_failure"]["rank"]')" = 2 ] ||
        fail "$mode: blamed rank $(json "$job/summary.json" 'v["first_failure"]["rank"]'), not the late rank 2: $cause"
    echo "# late rank ($mode): $cause"
done

# --- a rank that waits for one that works is no hang ----------------------------------------
# Rank 1 reports once, then waits in gpurun.barrier() while rank 0 reports every 0.2 s for 4 s
# before it joins: rank 1's report grows old, but the rank it waits for is working.
cat >"$work/works.py" <<EOF
import sys, time
sys.path.insert(0, "$root/lib/rank/python")
import gpurun
gpurun.report(1, loss=1.0)
if gpurun.rank() == 0:
    for step in range(2, 22):
        time.sleep(0.2)
        gpurun.report(step, loss=1.0)
gpurun.barrier("done", timeout=60)
EOF
run --local --gpus-per-node 2 --hang-timeout 1.5 --kill-grace 1 -- "$py" "$work/works.py"
expect_rc 0 "a rank waiting 4 s in a barrier for one that reports every 0.2 s"
echo "# a waiting rank's old report is no hang while the rank it waits for works"

# --- every rank waits on the others: a deadlock -----------------------------------------------
# Each rank reports once, then waits in a barrier of its own name (which needs both ranks):
# neither is released. Called when the waits, not only the reports, outlast the timeout (the
# moment a barrier's last rank arrives, every rank reads as waiting until the agents' next
# progress: that alone is no deadlock), and the cause says every rank waits.
cat >"$work/deadlock.py" <<EOF
import sys
sys.path.insert(0, "$root/lib/rank/python")
import gpurun
gpurun.report(1, loss=1.0)
gpurun.barrier("mine-%d" % gpurun.rank(), timeout=60)
EOF

job=$work/deadlock
t0=$(date +%s%N)
run --local --gpus-per-node 2 --hang-timeout 1 --kill-grace 1 --job-dir "$job" \
    -- "$py" "$work/deadlock.py"
ms=$((($(date +%s%N) - t0) / 1000000))
expect_rc 124 "a job whose ranks wait on each other"
cause=$(json "$job/summary.json" 'v["first_failure"]["cause"]')
[[ $cause == *"every rank waits on the others"* ]] || fail "deadlock: the cause does not say so: $cause"
[ "$ms" -lt 30000 ] || fail "deadlock: called after $ms ms"
echo "# deadlock: $cause (job over after $ms ms)"
