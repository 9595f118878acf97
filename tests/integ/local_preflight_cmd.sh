#!/usr/bin/env bash
# gpurun preflight: the pre-flight checks alone with --local. Three nodes and a spare pass:
# a line per node, "pre-flight: 4 of 4 nodes passed", exit 0, and no rank ran (the rank logs
# are empty). A job dir without the free space asked fails every node: FAILED lines naming
# the check and its figure, exit 125, the summary's first failure the same. A job (not
# gpurun preflight) whose nodes fail pre-flight says each node's cause once, in the leader's
# line that says what follows. A command, and --preflight off, are refused; gpurun help
# preflight prints its help.
# timeout: 60
set -euo pipefail
# shellcheck source=local_common.sh
. "$(dirname "$0")/local_common.sh"

# --- every node passes ------------------------------------------------------------------
run preflight --local -N 3 --spare-nodes 1 --job-dir "$work/ok"
expect_rc 0 "gpurun preflight"
for k in 0 1 2 3; do
    grep -qE "^node $k \([^)]+\): passed$" "$work/out" || fail "no passed line for node $k: $(cat "$work/out")"
done
[ "$(tail -n 1 "$work/out")" = "pre-flight: 4 of 4 nodes passed" ] || fail "last line: $(tail -n 1 "$work/out")"
[ "$(wc -l <"$work/out")" = 5 ] || fail "more than a line per node: $(cat "$work/out")"
[ "$(cat "$work/ok"/logs/*.log 2>/dev/null | wc -c)" = 0 ] || fail "a rank ran: $(cat "$work/ok"/logs/*)"
[ "$(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["outcome"], d["world_size"])' "$work/ok/summary.json")" = "completed 0" ] ||
    fail "summary: $(cat "$work/ok/summary.json")"

# --- every node fails the job dir's free space ---------------------------------------------
run preflight --local -N 2 --min-free 1000000000 --job-dir "$work/bad"
expect_rc 125 "gpurun preflight with too little free space"
for k in 0 1; do
    grep -qE "^node $k \([^)]+\): FAILED: job dir '.*': [0-9]+ MiB free, below 1000000000$" "$work/out" ||
        fail "no FAILED line for node $k: $(cat "$work/out")"
done
[ "$(tail -n 1 "$work/out")" = "pre-flight: 0 of 2 nodes passed" ] || fail "last line: $(tail -n 1 "$work/out")"
cause=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["first_failure"]["cause"])' "$work/bad/summary.json")
[[ $cause == "pre-flight failed on 2 of 2 nodes; node 0 ("*"): job dir '"*"': "*" MiB free, below 1000000000" ]] ||
    fail "first failure: $cause"

# --- a job whose pre-flight fails: each node's cause said once ----------------------------
run --local --gpus-per-node 2 --min-free 1000000000 -- true
expect_rc 125 "a job with too little free space"
[ "$(grep -c 'failed pre-flight' "$work/err")" = 1 ] ||
    fail "not one line for the one node that failed: $(grep 'pre-flight' "$work/err")"
grep -qE "error: job failed: node 0 \([^)]+\) failed pre-flight: job dir '.*': [0-9]+ MiB free, below 1000000000$" \
    "$work/err" || fail "no job failed line naming the check: $(cat "$work/err")"
# Two nodes and a spare, all failing: the job ends on node 0, the others are named beside it.
run --local -N 2 --spare-nodes 1 --gpus-per-node 1 --min-free 1000000000 -- true
expect_rc 125 "a job on 2 nodes and a spare with too little free space"
[ "$(grep -c 'failed pre-flight' "$work/err")" = 3 ] ||
    fail "not one line a node: $(grep 'pre-flight' "$work/err")"
for want in "error: job failed: node 0 (" "warn: node 1 (" "warn: spare node 2 ("; do
    [ "$(grep -cF "$want" "$work/err")" = 1 ] || fail "not one '$want' line: $(grep 'pre-flight' "$work/err")"
done

# --- refusals ------------------------------------------------------------------------------
run preflight --local -- true
expect_rc 125 "gpurun preflight -- true"
expect_err "gpurun: gpurun preflight runs no command: unexpected argument 'true'"
run preflight --local --preflight off
expect_rc 125 "gpurun preflight --preflight off"
expect_err "gpurun: gpurun preflight --preflight off: nothing to check"
run help preflight
expect_rc 0 "gpurun help preflight"
grep -q '^usage: gpurun preflight \[options\]$' "$work/out" || fail "help: $(head -n 3 "$work/out")"
echo "# gpurun preflight: 4 nodes passed; 2 failed on free space with 125; refusals said"
