#!/usr/bin/env bash
# gpurun preflight --local --min-gpu-free 50: a local job asks none of this machine's GPUs, so
# no node checks their memory: each node's line says the check was skipped and why, and the
# tally counts it (exit 0); without --min-gpu-free the lines say passed.
# timeout: 60
set -euo pipefail
# shellcheck source=local_common.sh
. "$(dirname "$0")/local_common.sh"

run preflight --local -N 2 --min-gpu-free 50
expect_rc 0 "gpurun preflight --local --min-gpu-free 50"
for k in 0 1; do
    grep -qxE "node $k \([^)]+\): skipped: GPU memory \(--min-gpu-free 50\): the job asks for no GPUs \(--local asks none of this machine\); the other checks passed" "$work/out" ||
        fail "node $k's line: $(cat "$work/out")"
done
[ "$(tail -n 1 "$work/out")" = "pre-flight: 2 of 2 nodes passed, 2 with a check skipped" ] ||
    fail "last line: $(tail -n 1 "$work/out")"
run preflight --local -N 1
expect_rc 0 "gpurun preflight --local"
grep -qxE "node 0 \([^)]+\): passed" "$work/out" || fail "without --min-gpu-free: $(cat "$work/out")"
echo "# --local --min-gpu-free: said skipped, not passed"
