#!/bin/bash
# CPUs per rank on the Slurm test cluster (nodes of 16 CPUs and 8 GPUs): by default each rank
# asks for its GPU's share of the node, 16 / 8 = 2 CPUs (not sbatch's one), in the script
# --emit-sbatch prints and in what slurmctld records; --cpus-per-gpu and SBATCH_CPUS_PER_GPU
# override it; with --no-gpus a rank's share is the node's CPUs over its ranks.
# timeout: 120
# lane: side
set -euo pipefail
export GR_SLURM_CPUS=16 GR_SLURM_GPUS=8
# shellcheck source=slurm_client_common.sh
. "$(dirname "$0")/slurm_client_common.sh"

# cpus_of ARGS...: the --cpus-per-task directive of the script gpurun ARGS --emit-sbatch prints.
cpus_of() {
    run emit.out emit.err --emit-sbatch "$@" -- true
    expect_rc "gpurun $* --emit-sbatch" 0
    sed -n 's/^#SBATCH --cpus-per-task=\([0-9]*\)$/\1/p' emit.out
}

[ "$(cpus_of -N 1 --gpus-per-node 4)" = 8 ] || grs_fail "4 GPUs: --cpus-per-task=$(cpus_of -N 1 --gpus-per-node 4), want 8 (2 per GPU)"
[ "$(cpus_of -N 1 --gpus-per-node 4 --cpus-per-gpu 1)" = 4 ] || grs_fail "--cpus-per-gpu 1 not taken"
[ "$(SBATCH_CPUS_PER_GPU=3 cpus_of -N 1 --gpus-per-node 4)" = 12 ] || grs_fail "SBATCH_CPUS_PER_GPU=3 not taken"
[ "$(cpus_of -N 1 --gpus-per-node 4 --no-gpus)" = 16 ] || grs_fail "--no-gpus: $(cpus_of -N 1 --gpus-per-node 4 --no-gpus), want 16 (4 per rank)"

# What slurmctld records for a job of 2 ranks per node: 2 CPUs per rank.
run sub.out sub.err -N 1 --gpus-per-node 2 --hold -- true
expect_rc "gpurun --hold" 0
id=$(job_id sub.out)
scontrol show job "$id" >job.txt
grep -qE '(^| )CPUs/Task=4( |$)' job.txt || grs_fail "CPUs/Task: $(grep -oE 'CPUs/Task=[^ ]*' job.txt)"
scancel "$id"
echo "# 2 CPUs per GPU by default on nodes of 16 CPUs and 8 GPUs; the flag and the variable override it"
