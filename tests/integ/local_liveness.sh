#!/usr/bin/env bash
# Liveness for scripts that never call gpurun.report: each rank's last line of output and its
# age in `gpurun status` (text and JSON) and the metrics file; --hang-watch output fails a job
# whose rank falls silent, naming it with its last line, within a small margin of the
# timeout, and leaves alone one whose ranks keep printing, however close to the timeout.
# timeout: 120
set -euo pipefail
# shellcheck source=local_common.sh
. "$(dirname "$0")/local_common.sh"

py=/usr/bin/python3
[ -x "$py" ] || py=python3

# --- the last line and its age --------------------------------------------------------------
job=$work/live
mkdir -p "$work/m"
# shellcheck disable=SC2016 # expanded by the ranks' shell
timeout -k 5 60 "$gpurun" --local --gpus-per-node 2 --job-dir "$job" --metrics-dir "$work/m" \
    -- sh -c 'echo "epoch 1 of rank $RANK: loss 0.5"; printf "\342\224\200 r%s \342\224\200\n" "$RANK"; exec sleep 7' \
    >"$work/out" 2>"$work/err" </dev/null &
gp=$!
bg_pids+=("$gp")
got=
for ((i = 0; i < 100; i++)); do
    if "$gpurun" status --job-dir "$job" --json >"$work/st.json" 2>/dev/null; then
        got=$("$py" -c 'import json, sys
v = json.load(open(sys.argv[1])); rs = (v.get("live") or {}).get("ranks") or []
print(" | ".join("%d:%s:%s" % (r["rank"], r.get("last_line"), r["output_age_ms"] >= 0) for r in rs))' "$work/st.json")
        [ "$got" = "0:─ r0 ─:True | 1:─ r1 ─:True" ] && break
    fi
    sleep 0.1
done
[ "$got" = "0:─ r0 ─:True | 1:─ r1 ─:True" ] || fail "status --json last_line, output_age_ms: '$got'"
"$gpurun" status --job-dir "$job" >"$work/st.txt" 2>&1 || fail "gpurun status: $(cat "$work/st.txt")"
grep -qE '^rank +node .* report +output +exit +last line$' "$work/st.txt" ||
    fail "status has no output and last line columns: $(grep '^rank' "$work/st.txt")"
grep -qE '^1 .* no reports +[0-9.]+s +- +─ r1 ─$' "$work/st.txt" ||
    fail "status's row of rank 1: $(grep -E '^1 ' "$work/st.txt")"
for ((i = 0; i < 80; i++)); do
    grep -qs 'gpurun_rank_output_age_seconds{.*rank="1"} [0-9.]' "$work"/m/*.prom && break
    sleep 0.1
done
grep -qs 'gpurun_rank_output_age_seconds{.*rank="1"} [0-9.]' "$work"/m/*.prom ||
    fail "the metrics file has no output age: $(cat "$work"/m/*.prom 2>/dev/null | tail -n 3)"
wait "$gp" || fail "the liveness job failed: $(tail -n 3 "$work/err")"
echo "# status and metrics: each rank's last line and output age"

# --- --hang-watch output: rank 1 falls silent ---------------------------------------------------
job=$work/silent
# shellcheck disable=SC2016 # expanded by the ranks' shell
run --local --gpus-per-node 2 --hang-timeout 2 --hang-watch output --kill-grace 1 --job-dir "$job" \
    -- sh -c 'if [ "$RANK" = 1 ]; then echo "loading shard 7"; exec sleep 60; fi
i=0; while [ $i -lt 100 ]; do echo "step $i"; i=$((i + 1)); sleep 0.2; done'
expect_rc 124 "a job whose rank 1 falls silent under --hang-watch output"
cause=$("$py" -c 'import json, sys; print(json.load(open(sys.argv[1]))["first_failure"]["cause"])' "$job/summary.json")
rank=$("$py" -c 'import json, sys; print(json.load(open(sys.argv[1]))["first_failure"]["rank"])' "$job/summary.json")
[ "$rank" = 1 ] || fail "blamed rank $rank, not the silent rank 1: $cause"
[[ $cause == "rank 1 on node 0 "*"hung: no output for "*" s (--hang-watch output); its last line: 'loading shard 7'" ]] ||
    fail "the cause: $cause"
# Found as soon as the timeout is past, as a report's silence is (the timeout and the
# leader's margin for a line on its way: well under 0.8 s), not a flush of lines later.
silence=${cause#*no output for }
silence=${silence%% s *}
awk -v s="$silence" 'BEGIN { exit !(s >= 2.0 && s < 2.8) }' ||
    fail "rank 1 was blamed after $silence s of silence, not within 0.8 s of the 2 s timeout"
echo "# silent rank: $cause"

# --- a rank silent for most of the timeout, again and again, is no hang ---------------------
# Each line after a 1.4 s silence must reach the leader before the 2 s timeout runs out.
# shellcheck disable=SC2016 # expanded by the ranks' shell
run --local --gpus-per-node 2 --hang-timeout 2 --hang-watch output --kill-grace 1 \
    -- sh -c 'i=0; while [ $i -lt 6 ]; do echo "slow step $i"; i=$((i + 1)); sleep 1.4; done'
expect_rc 0 "ranks printing every 1.4 s under --hang-watch output --hang-timeout 2"

# --- ranks that keep printing run to the end --------------------------------------------------
# shellcheck disable=SC2016 # expanded by the ranks' shell
run --local --gpus-per-node 2 --hang-timeout 1 --hang-watch output \
    -- sh -c 'i=0; while [ $i -lt 12 ]; do echo "tick $i"; i=$((i + 1)); sleep 0.2; done'
expect_rc 0 "ranks printing every 0.2 s under --hang-watch output --hang-timeout 1"

# --- bad values ---------------------------------------------------------------------------------
run --local --hang-watch sometimes -- true
expect_rc 125 "--hang-watch sometimes"
grep -q "hang-watch" "$work/err" || fail "no message naming --hang-watch: $(cat "$work/err")"

# --- a rank that waits for one that prints is no hang ---------------------------------------
root=$(cd "$(dirname "$0")/../.." && pwd)
cat >"$work/works.py" <<EOF
import sys, time
sys.path.insert(0, "$root/lib/rank/python")
import gpurun
gpurun.set("warm %d" % gpurun.rank(), b"1")
print("up", flush=True)
if gpurun.rank() == 0:
    for i in range(40):
        time.sleep(0.2)
        print("step", i, flush=True)
gpurun.barrier("done", timeout=60)
EOF
# Between its "up" and its barrier's request reaching the agent, rank 1 is silent and not yet
# waiting: the store request before "up" opens its link to the agent first (a loaded run once
# took over 3 s to connect there), and the timeout leaves a starved machine time for the rest.
# Rank 0 prints for 8 s, well past it.
run --local --gpus-per-node 2 --hang-timeout 3 --hang-watch output --kill-grace 1 \
    -- "$py" "$work/works.py"
expect_rc 0 "a rank silent 8 s in a barrier for one that prints every 0.2 s (--hang-watch output)"

# --- one rank waits for one that works without printing: no deadlock ----------------------
cat >"$work/quiet.py" <<EOF
import sys, time
sys.path.insert(0, "$root/lib/rank/python")
import gpurun
if gpurun.rank() == 1:
    gpurun.set("warm", b"1")
    print("up", flush=True)
else:
    time.sleep(6)
gpurun.barrier("done", timeout=60)
EOF
# As above: rank 1's link is open before its "up", and 2 s cover the rest on a starved machine.
run --local --gpus-per-node 2 --hang-timeout 2 --hang-watch output --kill-grace 1 \
    -- "$py" "$work/quiet.py"
expect_rc 0 "a rank waiting 6 s in a barrier for one that works and prints nothing (--hang-watch output)"

# --- a rank back from a long barrier wait: its silence counts from the release ---------------
# Rank 1 prints, waits 5 s in a barrier for rank 0 (which prints nothing), then works 1 s in
# silence: it is no more than 1 s silent since it was released, whatever its last line's age.
cat >"$work/back.py" <<EOF
import sys, time
sys.path.insert(0, "$root/lib/rank/python")
import gpurun
if gpurun.rank() == 1:
    gpurun.set("warm", b"1")
    print("up", flush=True)
else:
    time.sleep(5)
gpurun.barrier("mid", timeout=60)
time.sleep(1)
print("done", flush=True)
EOF
run --local --gpus-per-node 2 --hang-timeout 2 --hang-watch output --kill-grace 1 \
    -- "$py" "$work/back.py"
expect_rc 0 "a rank silent 1 s after a 5 s barrier wait (--hang-watch output)"

# --- only rank 0 prints: the silent others are not watched ------------------------------------
# shellcheck disable=SC2016 # expanded by the ranks' shell
run --local --gpus-per-node 3 --hang-timeout 1 --hang-watch output \
    -- sh -c 'i=0; while [ $i -lt 12 ]; do [ "$RANK" = 0 ] && echo "tick $i"; i=$((i + 1)); sleep 0.2; done'
expect_rc 0 "a job printing from rank 0 alone under --hang-watch output"
echo "# a waiting rank, and ranks that never print, are no hang"
