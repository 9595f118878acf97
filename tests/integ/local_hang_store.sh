#!/usr/bin/env bash
# Hang detection (--hang-watch report) and the store: a rank that reports once and then works
# only through the store (puts, gets, deletes, barriers with the others) is alive while it
# does, however old its report, and the job runs to its end; a get that ends a long wait
# restarts its silence as a barrier's release does. The waits themselves are no sign of
# life: ranks that talked to the store and then wait on each other are still a deadlock, and
# so are ranks that poll for a key nobody puts.
# timeout: 150
set -euo pipefail
# shellcheck source=local_common.sh
. "$(dirname "$0")/local_common.sh"

py=/usr/bin/python3
[ -x "$py" ] || py=python3

# json FILE EXPR: the Python expression EXPR of the JSON in FILE (as v).
json() {
    "$py" -c 'import json, sys; v = json.load(open(sys.argv[1])); print(eval(sys.argv[2]))' "$1" "$2"
}

cat >"$work/ranks.py" <<EOF
import sys, time
sys.path.insert(0, "$root/lib/rank/python")
import gpurun

ROUNDS, WORK = 3, 2.5
r = gpurun.rank()


def store_work(seconds, tag):
    """Puts, gets and deletes of this rank's own keys every 50 ms, nothing else."""
    end = time.monotonic() + seconds
    i = 0
    while time.monotonic() < end:
        key = "r%d/%s/%d" % (r, tag, i)
        gpurun.set(key, "x")
        assert gpurun.get(key, timeout=5) == b"x"
        if i % 4 == 0:
            gpurun.delete(key)
        i += 1
        time.sleep(0.05)


def report_work(seconds, step):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        step += 1
        gpurun.report(step, loss=1.0)
        time.sleep(0.1)
    return step


mode = sys.argv[1]
gpurun.report(0, loss=1.0)
if mode == "store":
    # Rank 1 never reports again: each round it talks only to the store for WORK s (longer
    # than the timeout), then meets the others at a barrier; they report all along.
    step = 0
    for k in range(ROUNDS):
        if r == 1:
            store_work(WORK, "round%d" % k)
        else:
            step = report_work(WORK, step)
        gpurun.barrier("round-%d" % k, timeout=60)
    # Rank 1 waits in a get for a key rank 0 puts after working WORK s, then is silent for
    # 0.5 s before the last barrier: its silence counts from the value's arrival, not from its
    # request. Ranks 2 and 3 wait at the barrier.
    if r == 1:
        assert gpurun.get("from-0", timeout=60) == b"go"
        time.sleep(0.5)
    elif r == 0:
        step = report_work(WORK, step)
        gpurun.set("from-0", "go")
        step = report_work(1.0, step)
    gpurun.barrier("end", timeout=60)
    print("rank %d done" % r)
elif mode == "deadlock":
    # Store traffic, then each rank in a barrier of its own name: nobody is released.
    store_work(2.0, "before")
    gpurun.barrier("mine-%d" % r, timeout=60)
else:
    # Polls for a key that no rank puts: each get ends empty-handed.
    while True:
        try:
            gpurun.get("never", timeout=0.3)
        except gpurun.TimeoutError:
            pass
EOF

# --- a rank that works through the store only ------------------------------------------------
job=$work/store
run --local -N 2 --gpus-per-node 2 --hang-timeout 1.5 --kill-grace 1 --job-dir "$job" \
    -- "$py" "$work/ranks.py" store
cause=$(json "$job/summary.json" '(v.get("first_failure") or {}).get("cause", "")' 2>/dev/null || true)
expect_rc 0 "a rank talking to the store for 3 x 2.5 s without a report (cause: '$cause')"
[ "$(grep -c '^\[[0-3]\] rank [0-3] done$' "$work/out")" = 4 ] ||
    fail "not every rank got to its end: $(cat "$work/out")"
! grep -qi 'hung' "$work/err" || fail "a hang was named: $(grep -i hung "$work/err")"
echo "# rank 1 worked 3 x 2.5 s through the store alone, then 0.5 s after a long get: no hang"

# --- store traffic, then a deadlock ----------------------------------------------------------
job=$work/deadlock
t0=$(date +%s%N)
run --local --gpus-per-node 2 --hang-timeout 1 --kill-grace 1 --job-dir "$job" \
    -- "$py" "$work/ranks.py" deadlock
ms=$((($(date +%s%N) - t0) / 1000000))
expect_rc 124 "ranks that talked to the store, then wait on each other"
cause=$(json "$job/summary.json" 'v["first_failure"]["cause"]')
[[ $cause == *"every rank waits on the others"* ]] || fail "deadlock: the cause does not say so: $cause"
[ "$ms" -lt 30000 ] || fail "deadlock: called after $ms ms"
echo "# deadlock after store traffic: $cause (job over after $ms ms)"

# --- ranks polling for a key nobody puts -----------------------------------------------------
job=$work/poll
t0=$(date +%s%N)
run --local --gpus-per-node 2 --hang-timeout 1 --kill-grace 1 --job-dir "$job" \
    -- "$py" "$work/ranks.py" poll
ms=$((($(date +%s%N) - t0) / 1000000))
expect_rc 124 "ranks polling the store for a key nobody puts"
cause=$(json "$job/summary.json" 'v["first_failure"]["cause"]')
[[ $cause == *" hung: "* ]] || fail "polling: the cause names no hang: $cause"
[ "$ms" -lt 30000 ] || fail "polling: called after $ms ms"
echo "# ranks polling for a missing key: $cause (job over after $ms ms)"
