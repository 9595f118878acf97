#!/usr/bin/env bash
# The gpurun Python module in real `gpurun --local` jobs (the package found through the
# PYTHONPATH rendezvousd sets; rank programs in tests/python/ranks.py, run by Debian's
# /usr/bin/python3 or $GPURUN_PYTHON): the store and barriers across 2 nodes of 2 ranks; C
# ranks (tests/gr_example) and Python ranks in one job reading each other's keys, the binary
# id put by either; `gpurun status --json` showing the step, loss and total_steps of Python
# reports (a NaN loss left out, and one warning line); SIGUSR1 to gpurun reaching the rank that
# called on_preempt (its callback runs, it exits 0, the job completes 0) and not the one that
# did not; a rank sending garbage on its own connection named in the agent's log while every
# rank is served as usual.
# timeout: 180
set -euo pipefail
# shellcheck source=local_common.sh
. "$(dirname "$0")/local_common.sh"

python=${GPURUN_PYTHON:-/usr/bin/python3}
ranks=$root/tests/python/ranks.py
[ -x "$python" ] || skip "no '$python'"
[ -x "$build/tests/gr_example" ] || skip "'$build/tests/gr_example' is not built (make)"
[ -f "$root/lib/rank/python/gpurun/__init__.py" ] || fail "no lib/rank/python/gpurun/__init__.py"

# No bytecode in the source tree from the ranks' imports.
export PYTHONDONTWRITEBYTECODE=1

# expect_line LINE WHAT: the merged stream ($work/out) has LINE exactly, once.
expect_line() {
    local n
    n=$(grep -cxF -- "$1" "$work/out" || true)
    [ "$n" = 1 ] || fail "$2: '$1' appears $n times in the merged stream, not once"
}

# --- the store and barriers, 2 nodes x 2 ranks ---------------------------------------------
t0=$(date +%s%N)
run --local -N 2 --gpus-per-node 2 --job-dir "$work/store" -- "$python" "$ranks" store
expect_rc 0 "the store job"
for r in 0 1 2 3; do
    expect_line "[$r] rank $r/4 local $((r % 2))/2 node $((r / 2)): python store ok, barrier ok" \
        "store job"
done
echo "# store and barriers, 2 nodes x 2 Python ranks: $((($(date +%s%N) - t0) / 1000000)) ms"

# --- C and Python ranks in one job -----------------------------------------------------------
# mixed EVEN ODD: the ranks whose RANK is even run EVEN (c: tests/gr_example, py: its Python
# twin in ranks.py), the odd ones ODD.
mixed() {
    local even=$1 odd=$2 r kind
    # shellcheck disable=SC2016 # expanded by the ranks' shell
    run --local -N 2 --gpus-per-node 2 --job-dir "$work/mixed-$even" -- sh -c '
        if [ $((RANK % 2)) = 0 ]; then kind=$1; else kind=$2; fi
        if [ "$kind" = c ]; then exec "$3" --steps 3; fi
        exec "$4" "$5" gr_example' sh "$even" "$odd" "$build/tests/gr_example" "$python" "$ranks"
    expect_rc 0 "the mixed job (even ranks $even, odd ranks $odd)"
    for r in 0 1 2 3; do
        kind=$odd
        [ $((r % 2)) = 0 ] && kind=$even
        if [ "$kind" = c ]; then
            expect_line "[$r] rank $r/4 local $((r % 2)) node $((r / 2)): store ok, barrier ok" \
                "mixed job, C rank $r"
        else
            expect_line "[$r] rank $r/4 local $((r % 2)) node $((r / 2)): python, store ok, barrier ok" \
                "mixed job, Python rank $r"
        fi
    done
}
mixed c py
mixed py c
echo "# C and Python ranks in one job: each reads the other's keys, rank 0 either"

# --- gpurun status --json shows Python reports ------------------------------------------------
# A fresh output file: the last job's lines must not count as this one's.
: >"$work/out"
"$gpurun" --local --gpus-per-node 2 --kill-grace 2 --job-dir "$work/status" -- \
    "$python" "$ranks" status >"$work/out" 2>"$work/err" </dev/null &
pid=$!
bg_pids+=("$pid")
wait_for_lines "$work/out" 2
# The reports reach the leader with the agent's next progress batch: poll.
want='0 10 2.0 500
1 11 None 500'
got=
for ((i = 0; i < 100; i++)); do
    timeout -k 2 20 "$gpurun" status --job-dir "$work/status" --json >"$work/status.json" \
        2>"$work/status.err" || true
    got=$("$python" -c '
import json, sys
job = json.load(open(sys.argv[1]))
for r in job["live"]["ranks"]:
    print(r["rank"], r["step"], r.get("loss"), r["total_steps"])' "$work/status.json" 2>/dev/null) || true
    [ "$got" = "$want" ] && break
    sleep 0.1
done
[ "$got" = "$want" ] || {
    echo "# status --json:"
    sed 's/^/#   /' "$work/status.json"
    fail "status --json ranks (rank step loss total_steps): got '$got', expected '$want'"
}
touch "$work/status/go"
rc=0
wait "$pid" || rc=$?
expect_rc 0 "the status job"
# A warning is the rank's stderr: gpurun's stderr.
n=$(grep -c 'gpurun.report: ranks.py:[0-9]*: loss is nan: not reported' "$work/err" || true)
[ "$n" = 1 ] || fail "the NaN loss: $n warning lines on gpurun's stderr, expected 1 (from rank 1)"
grep -q '^\[1\] gpurun.report: ranks.py:[0-9]*: loss is nan: not reported$' "$work/err" ||
    fail "the NaN warning does not come from rank 1"
echo "# status --json: step, loss, total_steps of each Python rank; a NaN loss is left out"

# --- the pre-timeout signal reaches the rank that asked, only it ------------------------------
# A fresh output file: the last job's lines must not count as this one's.
: >"$work/out"
"$gpurun" --local --gpus-per-node 2 --kill-grace 2 --job-dir "$work/preempt" -- \
    "$python" "$ranks" preempt >"$work/out" 2>"$work/err" </dev/null &
pid=$!
bg_pids+=("$pid")
wait_for_lines "$work/out" 2
kill -USR1 "$pid"
rc=0
wait "$pid" || rc=$?
expect_rc 0 "the preempt job after SIGUSR1"
expect_line "[0] asked for signal 10" "preempt job"
expect_line "[0] callback got signal [10]; preempt_requested() is True" "preempt job"
expect_line "[1] did not ask" "preempt job"
expect_line "[1] rank 1 ends" "preempt job"
if grep -q 'without asking' "$work/out"; then
    fail "SIGUSR1 reached a rank that did not ask for it: $(grep 'without asking' "$work/out")"
fi
echo "# SIGUSR1: the callback of the rank that asked ran, the other rank never got it, exit 0"

# --- garbage on a rank's own connection -------------------------------------------------------
run --local -N 2 --gpus-per-node 2 --job-dir "$work/garbage" -- "$python" "$ranks" garbage
expect_rc 0 "the garbage job"
expect_line "[3] garbage answered: error bad_request" "garbage job"
expect_line "[3] garbage before hello: error bad_request, closed" "garbage job"
for r in 0 1 2 3; do
    expect_line "[$r] rank $r: store ok after the garbage" "garbage job"
done
grep -qE 'error.*bad message from rank 3: ' "$work/err" || {
    show "$work/err"
    fail "the agent's log has no error line naming rank 3 for its garbage"
}
echo "# garbage: '$(grep -m1 'bad message from rank 3' "$work/err" | sed 's/.*\(bad message\)/\1/')'"
