#!/bin/bash
# A plain torch DDP script (gloo, env://) that reports through the gpurun Python module,
# under `gpurun --local` on 2 nodes of 2 ranks: `gpurun status` shows every rank's step and
# loss and a progress bar while it runs; a rank that stops reporting while the others wait
# for it in the allreduce is found within hang_timeout + 1 s, it is the one blamed, and its
# Python traceback (faulthandler) is in its log, in summary.json and in `gpurun status`.
# Uses Debian's python3-torch (/usr/bin/python3, or $TORCH_PYTHON); skips without it.
# timeout: 240
set -euo pipefail
# shellcheck source=local_common.sh
. "$(dirname "$0")/local_common.sh"

python=${TORCH_PYTHON:-/usr/bin/python3}
[ -x "$python" ] || skip "no '$python'"
"$python" -c 'import importlib.util as u; assert u.find_spec("torch")' >/dev/null 2>&1 ||
    skip "'$python' has no torch (Debian's python3-torch)"
export GLOO_SOCKET_IFNAME=lo
script=$root/tests/ranks/torch_ddp.py

# json FILE EXPR: the Python expression EXPR of the JSON in FILE (as v).
json() {
    "$python" -c 'import json, sys; v = json.load(open(sys.argv[1])); print(eval(sys.argv[2]))' "$1" "$2"
}

# --- status while it runs -------------------------------------------------------------------
job=$work/live
"$gpurun" --local -N 2 --gpus-per-node 2 --job-dir "$job" -- "$python" "$script" \
    --steps 60 --step-ms 100 >"$work/out" 2>"$work/err" </dev/null &
pid=$!
bg_pids+=("$pid")
seen=
for ((i = 0; i < 300; i++)); do
    if "$gpurun" status --job-dir "$job" --json >"$work/st.json" 2>/dev/null &&
        [ "$(json "$work/st.json" '(v["progress"] or {}).get("step_min", 0) >= 3 and "eta_s" in v["progress"]')" = True ]; then
        seen=1
        break
    fi
    sleep 0.1
done
# (The ETA needs two reports of a rank to reach the leader: its rate of steps.)
[ -n "$seen" ] || fail "gpurun status never showed every rank past step 3 with an ETA: $(head -c 600 "$work/st.json")"
for r in 0 1 2 3; do
    [ "$(json "$work/st.json" "v['live']['ranks'][$r]['step'] >= 3 and v['live']['ranks'][$r]['loss'] > 0 and v['live']['ranks'][$r]['total_steps']")" = 60 ] ||
        fail "rank $r's live status: $(json "$work/st.json" "v['live']['ranks'][$r]")"
done
[ "$(json "$work/st.json" 'v["progress"]["steps_total"]')" = 60 ] || fail "no total of 60 steps"
"$gpurun" status --job-dir "$job" >"$work/st.txt" 2>&1 || true
grep -qE '^progress: \[#+\.*\] +[0-9]+% \([0-9]+/60\), ETA [0-9]+m[0-9]{2}s$' "$work/st.txt" ||
    fail "gpurun status has no progress bar with an ETA: $(cat "$work/st.txt")"
[ "$(json "$work/st.json" '0 < v["progress"]["eta_s"] < 60')" = True ] ||
    fail "no ETA under a minute for 60 steps of 0.1 s: $(json "$work/st.json" 'v["progress"]')"
grep -qE '^step: [0-9]+.* of 60, loss [0-9.]+' "$work/st.txt" || fail "no step line: $(head -n 8 "$work/st.txt")"
# Rank 0's recent losses: a sparkline, and in JSON one [step, loss] per step it reported. It
# needs two of rank 0's reports at the leader (the agent passes them on every 250 ms), which
# the ETA above does not (another rank's two give the rate): wait for them while the job runs.
spark='^loss: (▁|▂|▃|▄|▅|▆|▇|█){2,} [0-9.]+ -> [0-9.]+ \(rank 0, steps [0-9]+-[0-9]+\)$'
# The JSON is read after the text, so that it holds at least the reports the text shows (st.txt
# above was read after st.json).
for ((i = 0; i < 50; i++)); do
    "$gpurun" status --job-dir "$job" >"$work/st.txt" 2>&1 || true
    "$gpurun" status --job-dir "$job" --json >"$work/st.json" 2>/dev/null || true
    grep -qE "$spark" "$work/st.txt" && break
    sleep 0.1
done
grep -qE "$spark" "$work/st.txt" ||
    fail "no loss sparkline: $(grep '^loss' "$work/st.txt" || head -n 8 "$work/st.txt")"
[ "$(json "$work/st.json" 'len(v["live"]["loss_history"]) >= 2 and all(a[0] < b[0] for a, b in zip(v["live"]["loss_history"], v["live"]["loss_history"][1:]))')" = True ] ||
    fail "loss_history: $(json "$work/st.json" 'v["live"].get("loss_history")')"
rc=0
wait "$pid" || rc=$?
[ "$rc" = 0 ] || fail "the DDP job exited with $rc"
echo "# status of a running torch DDP job: 4 ranks' steps and losses, a progress bar of 60 steps"

# --- a stalled rank -------------------------------------------------------------------------
hang=3
job=$work/hung
run --local -N 2 --gpus-per-node 2 --hang-timeout "$hang" --kill-grace 1 --job-dir "$job" \
    -- "$python" "$script" --steps 200 --step-ms 20 --stall-rank 2 --stall-step 10
expect_rc 124 "a DDP job with a stalled rank"
sum=$job/summary.json
[ "$(json "$sum" 'v["outcome"], v["first_failure"]["rank"]')" = "('hung', 2)" ] ||
    fail "outcome and blamed rank: $(json "$sum" 'v["outcome"], v["first_failure"]')"
cause=$(json "$sum" 'v["first_failure"]["cause"]')
age=$(sed -n 's/.*no progress report for \([0-9.]*\) s.*/\1/p' <<<"$cause")
awk -v a="$age" -v h="$hang" 'BEGIN { exit !(a >= h && a <= h + 1) }' ||
    fail "detected after ${age:-?} s without a report, not within $hang + 1 s: $cause"
log=$job/logs/rank-2.log
grep -q '^Fatal Python error: Aborted' "$log" || fail "rank 2's log has no faulthandler dump"
grep -qE "File \".*torch_ddp.py\", line [0-9]+ in main" "$log" ||
    fail "rank 2's log lacks its Python stack in main: $(tail -n 20 "$log")"
for r in 0 1 3; do
    json "$sum" "v['ranks'][$r].get('stack') or ''" >"$work/stack.$r"
    grep -q 'torch_ddp.py' "$work/stack.$r" || fail "no Python stack of rank $r in summary.json"
done
json "$sum" 'v["first_failure"].get("stack") or ""' >"$work/stack.2"
grep -qE 'time.sleep|line [0-9]+ in main' "$work/stack.2" ||
    fail "the blamed rank's stack in summary.json: $(cat "$work/stack.2")"
"$gpurun" status --job-dir "$job" >"$work/st.txt" 2>&1 || true
grep -qF "stack of rank 2" "$work/st.txt" || fail "gpurun status lacks the blamed rank's stack"
grep -qF "torch_ddp.py" "$work/st.txt" || fail "gpurun status's stack is not Python's"
echo "# stalled rank 2 blamed after $age s (timeout $hang s); its Python stack in its log, summary.json and status"
