#!/bin/bash
# sbatch's habit --gres gpu:N on the Slurm test cluster (untyped fake GPUs): --gres gpu:2 is
# --gpus-per-node 2 (two ranks a node, each node's two GPUs in CUDA_VISIBLE_DEVICES, gres/gpu=4
# for the job), with another item of --gres kept beside it; gpu:TYPE:N goes to Slurm with its
# type (#SBATCH --gpus-per-node=TYPE:N), which this cluster's untyped GPUs cannot give; a
# --gres that contradicts --gpus-per-node is refused with one line, nothing submitted.
# timeout: 120
# lane: side
set -euo pipefail
# shellcheck source=slurm_client_common.sh
. "$(dirname "$0")/slurm_client_common.sh"

# shellcheck disable=SC2016 # expanded by each rank
run wait.out wait.err --wait -N 2 --gres gpu:2,nvme:1 -- sh -c \
    'echo "rank $RANK of $WORLD_SIZE local $LOCAL_RANK/$LOCAL_WORLD_SIZE gpus $CUDA_VISIBLE_DEVICES"'
expect_rc "gpurun --wait -N 2 --gres gpu:2,nvme:1" 0
for r in 0 1 2 3; do
    grep -qxF "[$r] rank $r of 4 local $((r % 2))/2 gpus 0,1" wait.out ||
        grs_fail "rank $r's line: $(grep "^\[$r\]" wait.out)"
done
id=$(job_id wait.out)
scontrol show job "$id" >job.txt
grep -qE 'TresPerNode=(gres:)?gpu:2,(gres:)?nvme:1' job.txt ||
    grs_fail "the job's TresPerNode: $(grep -oE 'TresPerNode=[^ ]*' job.txt)"

run emit.out emit.err --emit-sbatch -N 1 --gres gpu:a100:2 -- true
expect_rc "--emit-sbatch --gres gpu:a100:2" 0
grep -qx '#SBATCH --gpus-per-node=a100:2' emit.out || grs_fail "no typed GPU directive: $(grep SBATCH emit.out)"
! grep -q '^#SBATCH --gres' emit.out || grs_fail "the GPUs asked twice: $(grep SBATCH emit.out)"
run typed.out typed.err -N 1 --gres gpu:a100:2 -- true
expect_rc "--gres gpu:a100:2 on a cluster without a100s" 125
grep -q "^gpurun: Slurm cannot give 1 node with 2 GPUs .*; nothing submitted$" typed.err ||
    grs_fail "a typed request Slurm cannot give: $(cat typed.err)"

run both.out both.err -N 1 --gres gpu:2 --gpus-per-node 3 -- true
expect_rc "--gres gpu:2 --gpus-per-node 3" 125
[ "$(cat both.err)" = "gpurun: --gpus-per-node 3 and --gres gpu:2 differ: gpurun runs one rank per GPU, so both count the ranks per node (it starts a node's ranks itself); give one of them" ] ||
    grs_fail "the contradiction: $(cat both.err)"
out=$(scontrol -o show jobs 2>&1)
[ "$(grep -c JobId= <<<"$out")" = 1 ] || grs_fail "jobs after the refusals: $out"
echo "# --gres gpu:2 is --gpus-per-node 2; gpu:TYPE:N keeps its type; a contradiction refused"
