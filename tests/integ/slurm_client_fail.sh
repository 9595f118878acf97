#!/bin/bash
# A failing rank on the Slurm test cluster: rank 3, on the second node, prints a table line
# and an invalid byte, then exits 3 while the others sleep. gpurun --wait exits 3, with the daemon's line naming the rank and node in the
# stream; status names the first failure (rank, node, host, code, last lines) as text and
# JSON, and Slurm's state is FAILED; no rank is left on any node. Then a rank's Python
# exception with --max-restarts 2: not retried, its class user-error.
# timeout: 120
# lane: side
set -euo pipefail
# shellcheck source=slurm_client_common.sh
. "$(dirname "$0")/slurm_client_common.sh"

t0=$(grs_now_ms)
# shellcheck disable=SC2016 # expanded by each rank
run wait.out wait.err --wait -N 2 --gpus-per-node 2 --kill-grace 1 -- sh -c \
    'echo "up $RANK"; if [ "$RANK" = 3 ]; then printf "\342\224\202 loss \342\224\202 \377\n"; echo "rank 3 gives up"; exit 3; fi; exec sleep 3003'
echo "# fail_ms=$(($(grs_now_ms) - t0))"
expect_rc "gpurun --wait of a failing job" 3
id=$(job_id wait.out)
grep -qF "job failed: rank 3 on node 1 ('node2') exited with status 3" wait.out ||
    grs_fail "the stream does not name the failing rank: $(grep -v '^\[' wait.out | head -n 5)"
grep -qF "gpurun: job $id FAILED with exit status 3" wait.err ||
    grs_fail "gpurun's last line: $(tail -n 1 wait.err)"

run st.txt st.err status "$id"
expect_rc "gpurun status" 0
grep -qxF "state: FAILED, exit status 3" st.txt || grs_fail "status: $(head -n 2 st.txt)"
grep -qxF "first failure (user-error): rank 3 on node 1 ('node2') exited with status 3" st.txt ||
    grs_fail "status does not name the first failure once: $(grep -i fail st.txt)"
# srun's own lines ("task 1: Exited with exit code 3", a daemon's) stay out: the daemon's
# line above names the rank (slurm_client_output shows where they are needed).
! grep -hE "^srun: |srun's 'task K'" wait.out wait.err ||
    grs_fail "srun's lines in the stream of a rank's failure"
grep -qxF "  rank 3 gives up" st.txt || grs_fail "status lacks the failing rank's last lines"
grep -qxF "  │ loss │ �" st.txt || grs_fail "status lacks the rank's table line, its byte replaced"
run st.json st.err status "$id" --json
expect_rc "gpurun status --json" 0
[ "$(json st.json 'v["slurm"]["state"], v["exit_status"], v["summary"]["outcome"]')" = \
    "('FAILED', 3, 'failed')" ] || grs_fail "status --json: state, exit status or outcome"
ff=$(json st.json '[v["first_failure"][k] for k in ("rank", "node", "hostname", "code")]')
[ "$ff" = "[3, 1, 'node2', 3]" ] || grs_fail "status --json first_failure: $ff"
if pgrep -f 'sleep 3003$' >/dev/null; then
    grs_fail "ranks left after the failure: $(pgrep -af 'sleep 3003')"
fi
echo "# a failing rank: --wait 3, status names rank 3 on node 1 (node2)"

# A Python exception is the user's: --max-restarts 2 does not retry it (a node loss it does:
# slurm_spares, slurm_spares_train).
# shellcheck disable=SC2016 # expanded by each rank
run exc.out exc.err --wait -N 2 --gpus-per-node 1 --max-restarts 2 --kill-grace 1 -- sh -c \
    'if [ "$RANK" = 1 ]; then exec "$0" -c "raise ValueError(\"a bug\")"; fi; exec sleep 3004' "$py"
expect_rc "gpurun --wait of a job whose rank raises" 1
id=$(job_id exc.out)
grep -qF "not restarting: a user-error failure, which --restart-on does not name" exc.out ||
    grs_fail "no line saying the exception is not retried: $(grep -v '^\[' exc.out | head -n 8)"
[ "$(json "$GPURUN_JOBS/$id/summary.json" 'v["restarts"], v["first_failure"]["class"]')" = "(0, 'user-error')" ] ||
    grs_fail "summary: restarts and class $(json "$GPURUN_JOBS/$id/summary.json" 'v["restarts"], v["first_failure"].get("class")')"
echo "# a Python exception with --max-restarts 2: not retried (user-error)"
