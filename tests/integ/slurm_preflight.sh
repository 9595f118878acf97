#!/bin/bash
# Pre-flight on the Slurm test cluster, each node's GPUs read through the fake NVML
# (tests/helpers/fake_nvml.c): gpurun's environment (GPURUN_FAKE_NVML_DIR, the fake library's
# directory first in LD_LIBRARY_PATH) reaches every node's rendezvousd through sbatch and srun,
# and each node reads the file named by its hostname, else "default" (the cluster's
# GR_SLURM_GPUS GPUs, all free, so that CUDA_VISIBLE_DEVICES's indices from Slurm's GRES name
# them). A 2-node job with --spare-nodes 1 takes the 3 nodes; node2 (node 1) fails pre-flight
# before any rank starts and the spare node3 takes its place, the job completing: once with
# its GPUs held by another process (--min-gpu-free 50), once with a GPU missing (2 asked, 1 in
# NVML). summary.json and gpurun status name the swap and the check that failed.
# timeout: 240
# lane: side
set -euo pipefail
# shellcheck source=slurm_client_common.sh
. "$(dirname "$0")/slurm_client_common.sh" tests/fakenvml/libnvidia-ml.so.1

nvml=$GRS_WORK/nvml
mkdir "$nvml"
# gpus N TOTAL FREE: N lines of a fake NVML file.
gpus() {
    local g
    for ((g = 0; g < $1; g++)); do
        echo "$2 $3"
    done
}
gpus "$GR_SLURM_GPUS" 81920 81000 >"$nvml/default"
fake_env=(env "GPURUN_FAKE_NVML_DIR=$nvml"
    "LD_LIBRARY_PATH=$GRS_BUILD/tests/fakenvml${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")

# swap_job NAME ARGS...: gpurun --wait with ARGS, a 2-node job with a spare whose ranks say
# where they run, under the fake NVML; checks that it completed with node 1 (node2) replaced by
# the spare (node3) before generation 0, node2 running no rank; sets id and cause (the swap's).
swap_job() {
    local name=$1 summary
    shift
    rc=0
    # shellcheck disable=SC2016 # expanded by each rank
    timeout 150 "${fake_env[@]}" "$gpurun" --wait -N 2 --spare-nodes 1 "$@" -- \
        sh -c 'echo "rank $RANK node_rank $NODE_RANK on $(hostname)"' \
        >"$name.out" 2>"$name.err" </dev/null || rc=$?
    id=$(job_id "$name.out")
    [ -n "$id" ] || grs_fail "$name: no job id: $(tail -n 5 "$name.err")"
    summary=$GPURUN_JOBS/$id/summary.json
    [ "$rc" = 0 ] ||
        grs_fail "$name: --wait exited $rc: $(tail -n 5 "$name.err"); summary: $(head -n 40 "$summary" 2>&1)"
    [ "$(json "$summary" 'v["outcome"]')" = completed ] ||
        grs_fail "$name: outcome $(json "$summary" 'v["outcome"]')"
    [ "$(json "$summary" '[n["hostname"] for n in v["nodes"]]')" = "['node1', 'node2', 'node3']" ] ||
        grs_fail "$name: nodes $(json "$summary" '[n["hostname"] for n in v["nodes"]]')"
    [ "$(json "$summary" '[(s["node"], s["spare"], s["generation"]) for s in v["swaps"]]')" = "[(1, 2, 0)]" ] ||
        grs_fail "$name: swaps $(json "$summary" 'v.get("swaps")')"
    cause=$(json "$summary" 'v["swaps"][0]["cause"]')
    grep -qx "\[[0-9]*\] rank [0-9]* node_rank 1 on node3" "$name.out" ||
        grs_fail "$name: node 1's ranks did not run on the spare node3: $(cat "$name.out")"
    if grep -q "on node2$" "$name.out"; then
        grs_fail "$name: a rank ran on node2, which failed pre-flight: $(cat "$name.out")"
    fi
    run "$name.st" "$name.st.err" status "$id"
    expect_rc "$name: gpurun status" 0
    grep -qF "node 1 (node2) fenced: $cause; spare node 2 (node3) took its place (generation 0)" \
        "$name.st" || grs_fail "$name: status lacks the swap: $(cat "$name.st")"
}

# --- node2's GPUs held by another process ------------------------------------------------------
gpus "$GR_SLURM_GPUS" 81920 1024 >"$nvml/node2"
swap_job busy --gpus-per-node 1 --min-gpu-free 50
[ "$(json "$GPURUN_JOBS/$id/job.json" 'v["min_gpu_free_pct"]')" = 50 ] ||
    grs_fail "job.json: min_gpu_free_pct $(json "$GPURUN_JOBS/$id/job.json" 'v.get("min_gpu_free_pct")')"
[[ $cause =~ ^"node 1 ('node2') failed pre-flight: GPU "[0-9]+" (NVML): 1024 of 81920 MiB free, below 50%"$ ]] ||
    grs_fail "busy: the swap's cause: $cause"
echo "ok - node2's GPU without --min-gpu-free's memory free: the spare node3 took its place"

# --- node2 shows 1 of the 2 GPUs asked ----------------------------------------------------------
gpus 1 81920 81000 >"$nvml/node2"
swap_job missing --gpus-per-node 2
[ "$cause" = "node 1 ('node2') failed pre-flight: 1 of 2 GPUs visible (NVML)" ] ||
    grs_fail "missing: the swap's cause: $cause"
echo "ok - node2 short of a GPU in NVML: the spare node3 took its place"
