#!/bin/bash
# Pre-flight says what it checked, on the Slurm test cluster (fake GPUs in
# CUDA_VISIBLE_DEVICES, no NVML): gpurun preflight --min-gpu-free 50 says on every node's
# line that the GPU memory check was skipped and why (no NVML, the loader's word), not that
# it passed; the tally counts the skips; exit 0. With --min-gpu-free 0 nothing is skipped.
# timeout: 120
# lane: side
set -euo pipefail
# shellcheck source=slurm_client_common.sh
. "$(dirname "$0")/slurm_client_common.sh"

run pf.out pf.err preflight -N 2 --gpus-per-node 1 --min-gpu-free 50
expect_rc "gpurun preflight --min-gpu-free 50 without NVML" 0
for k in 0 1; do
    grep -qE "^node $k \(node[0-9]\): skipped: GPU memory \(--min-gpu-free 50\): no NVML \(libnvidia-ml\.so\.1: cannot open shared object file.*\); the other checks passed(; link [0-9]+ Mbit/s)?$" pf.out ||
        grs_fail "node $k's line: $(cat pf.out)"
done
[ "$(tail -n 1 pf.out)" = "pre-flight: 2 of 2 nodes passed, 2 with a check skipped" ] ||
    grs_fail "the last line: $(tail -n 1 pf.out)"
id=$(job_id pf.out)
[ "$(json "$GPURUN_JOBS/$id/summary.json" '"no NVML" in v["nodes"][1]["preflight_skipped"]')" = True ] ||
    grs_fail "summary.json lacks node 1's preflight_skipped"

run off.out off.err preflight -N 2 --gpus-per-node 1 --min-gpu-free 0
expect_rc "gpurun preflight --min-gpu-free 0" 0
[ "$(grep -cE '^node [01] \(node[0-9]\): passed(; link [0-9]+ Mbit/s)?$' off.out)" = 2 ] || grs_fail "--min-gpu-free 0: $(cat off.out)"
echo "# no NVML: the GPU memory check said skipped, with why, on every node"
