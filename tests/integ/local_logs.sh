#!/usr/bin/env bash
# gpurun logs puts every rank's lines in the order they were written (the daemons index each
# rank log by time, logs/rank-N.idx), across nodes; --rank R prints one log as it is; a job
# dir without the indexes is printed rank by rank.
# timeout: 60
set -euo pipefail
# shellcheck source=local_common.sh
. "$(dirname "$0")/local_common.sh"

job=$work/job
# Rank 0 (node 0) and rank 1 (node 1) take turns, 300 ms apart.
# shellcheck disable=SC2016 # expanded by each rank
run --local -N 2 --job-dir "$job" -- sh -c \
    'if [ "$RANK" = 0 ]; then echo a1; sleep 0.6; echo a2; else sleep 0.3; echo b1; sleep 0.6; echo b2; fi'
expect_rc 0 "the job"
if [ ! -s "$job/logs/rank-0.idx" ] || [ ! -s "$job/logs/rank-1.idx" ]; then fail "no index beside the logs"; fi
"$gpurun" logs --job-dir "$job" >"$work/logs" 2>&1 || fail "logs: $(cat "$work/logs")"
[ "$(tr '\n' ' ' <"$work/logs")" = "[0] a1 [1] b1 [0] a2 [1] b2 " ] ||
    fail "logs not in the order written: $(tr '\n' ' ' <"$work/logs")"
"$gpurun" logs --job-dir "$job" --rank 1 >"$work/logs" 2>&1 || fail "logs --rank 1"
[ "$(tr '\n' ' ' <"$work/logs")" = "b1 b2 " ] || fail "logs --rank 1: $(tr '\n' ' ' <"$work/logs")"
# With too few descriptors to hold every log and index open, still every line, rank by rank.
(
    ulimit -n 6
    "$gpurun" logs --job-dir "$job"
) >"$work/logs" 2>&1 || fail "logs under ulimit -n 6: $(cat "$work/logs")"
[ "$(tr '\n' ' ' <"$work/logs")" = "[0] a1 [0] a2 [1] b1 [1] b2 " ] ||
    fail "logs under ulimit -n 6: $(tr '\n' ' ' <"$work/logs")"
rm "$job"/logs/rank-*.idx
"$gpurun" logs --job-dir "$job" >"$work/logs" 2>&1 || fail "logs without indexes"
[ "$(tr '\n' ' ' <"$work/logs")" = "[0] a1 [0] a2 [1] b1 [1] b2 " ] ||
    fail "logs without indexes: $(tr '\n' ' ' <"$work/logs")"
echo "# gpurun logs merged 2 nodes' ranks in the order written; rank by rank without indexes"
