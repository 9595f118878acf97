#!/usr/bin/env bash
# Restarts by failure class: a Python exception (user-error) is not restarted by default and
# says why; a rank killed by a signal is; a rank whose last words are NCCL's error is a node
# failure, restarted; --restart-on user-error restarts the exception and --restart-on none
# nothing. summary.json carries each failure's class, the first and the earlier ones. A
# failure that a restart follows is logged as a generation's (a warning), "job failed" only
# when the job ends on it.
# timeout: 120
set -euo pipefail
# shellcheck source=local_common.sh
. "$(dirname "$0")/local_common.sh"

py=/usr/bin/python3
[ -x "$py" ] || py=python3

# summary DIR EXPR: the Python expression EXPR of DIR/summary.json (as d).
summary() {
    "$py" -c 'import json, sys; d = json.load(open(sys.argv[1])); print(eval(sys.argv[2]))' \
        "$1/summary.json" "$2"
}

# A Python bug, in every generation: one failure, no restart.
run --local --gpus-per-node 2 --max-restarts 2 --kill-grace 1 --job-dir "$work/bug" -- "$py" -c \
    'import os, time
if os.environ["RANK"] == "1": raise ValueError("bad config")
time.sleep(30)'
expect_rc 1 "a Python exception under --max-restarts 2"
[ "$(summary "$work/bug" '(d["outcome"], d["restarts"], d["first_failure"]["class"])')" = \
    "('failed', 0, 'user-error')" ] ||
    fail "the exception: $(summary "$work/bug" '(d["outcome"], d["restarts"], d["first_failure"].get("class"))')"
grep -q 'warn: not restarting: a user-error failure, which --restart-on does not name' "$work/err" ||
    fail "no line saying why the exception is not restarted"

# A rank killed by a signal in generation 0: restarted, and the job completes.
# shellcheck disable=SC2016 # expanded by the ranks' shell
run --local --gpus-per-node 2 --max-restarts 1 --kill-grace 1 --job-dir "$work/sig" -- sh -c \
    '[ "$GPURUN_RESTART_COUNT" = 0 ] && [ "$RANK" = 1 ] && kill -KILL $$; sleep 0.3'
expect_rc 0 "a SIGKILL in generation 0 under --max-restarts 1"
[ "$(summary "$work/sig" '(d["outcome"], d["restarts"], d["earlier_failures"][0]["class"])')" = \
    "('completed', 1, 'signal')" ] || fail "the signal: $(summary "$work/sig" '(d["outcome"], d["restarts"])')"
# The failure ended a generation, not the job: a warning, no "job failed".
grep -q "warn: generation 0 failed, a restart follows: rank 1 on node 0 ('[^']*') was killed by signal 9" \
    "$work/err" || fail "no warning that generation 0 failed and a restart follows: $(grep -v '^\[' "$work/err")"
! grep -q 'job failed' "$work/err" || fail "a restarted failure is called the job's: $(grep 'job failed' "$work/err")"

# The same failure in every generation: the last one, with no restart left, fails the job.
# shellcheck disable=SC2016 # expanded by the ranks' shell
run --local --gpus-per-node 2 --max-restarts 1 --kill-grace 1 --job-dir "$work/again" -- sh -c \
    '[ "$RANK" = 1 ] && kill -KILL $$; sleep 30'
expect_rc 137 "a SIGKILL in every generation under --max-restarts 1"
[ "$(grep -c 'warn: generation 0 failed, a restart follows: rank 1 ' "$work/err")" = 1 ] ||
    fail "generation 0's failure: $(grep -v '^\[' "$work/err")"
if [ "$(grep -c 'job failed' "$work/err")" != 1 ] ||
    ! grep -q "error: job failed: rank 1 on node 0 ('[^']*') was killed by signal 9" "$work/err"; then
    fail "not one 'job failed' line for the last generation: $(grep -v '^\[' "$work/err")"
fi

# NCCL's error in the rank's last words: the node's, restarted.
# shellcheck disable=SC2016 # expanded by the ranks' shell
run --local --gpus-per-node 2 --max-restarts 1 --kill-grace 1 --job-dir "$work/nccl" -- sh -c \
    'if [ "$GPURUN_RESTART_COUNT" = 0 ] && [ "$RANK" = 0 ]; then
         echo "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error" >&2; exit 1
     fi; sleep 0.3'
expect_rc 0 "an NCCL error in generation 0 under --max-restarts 1"
[ "$(summary "$work/nccl" '(d["restarts"], d["earlier_failures"][0]["class"])')" = "(1, 'node')" ] ||
    fail "the NCCL error: $(summary "$work/nccl" '(d["restarts"], d["earlier_failures"])')"

# --restart-on user-error: the exception of generation 0 is restarted.
# shellcheck disable=SC2016 # expanded by the ranks' shell
run --local --gpus-per-node 2 --max-restarts 1 --restart-on user-error,signal --kill-grace 1 \
    --job-dir "$work/user" -- sh -c '[ "$GPURUN_RESTART_COUNT" = 0 ] && [ "$RANK" = 1 ] && exit 4; sleep 0.3'
expect_rc 0 "an exit 4 in generation 0 under --restart-on user-error,signal"
[ "$(summary "$work/user" 'd["restarts"]')" = 1 ] || fail "--restart-on user-error did not restart"

# --restart-on none: not even a signal.
# shellcheck disable=SC2016 # expanded by the ranks' shell
run --local --gpus-per-node 2 --max-restarts 3 --restart-on none --kill-grace 1 \
    --job-dir "$work/none" -- sh -c '[ "$RANK" = 1 ] && kill -KILL $$; sleep 30'
expect_rc 137 "a SIGKILL under --restart-on none"
[ "$(summary "$work/none" '(d["restarts"], d["first_failure"]["class"])')" = "(0, 'signal')" ] ||
    fail "--restart-on none: $(summary "$work/none" '(d["restarts"], d["first_failure"].get("class"))')"

# A word that is no class.
run --local --restart-on user-error,sometimes -- true
expect_rc 125 "--restart-on sometimes"
expect_err "gpurun: --restart-on: 'sometimes' is not user-error, node, hang, oom, signal, all or none"
echo "# classes: user-error not restarted, signal and node restarted, --restart-on obeyed"
