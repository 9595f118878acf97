#!/bin/bash
# Slurm's per-task variables of a gpurun job's ranks on the Slurm test cluster: the batch
# script of a 2-node x 2-rank job (gpurun --emit-sbatch), with a reference step inserted
# before its own srun line, `srun -n 4 --ntasks-per-node=2 --cpus-per-task=C/2`, whose tasks
# write their environments beside those of the job's ranks. Every SLURM*, PMI_* and PMIX_*
# variable of rank r must equal that of the reference task with SLURM_PROCID=r, but for the
# step's own (ALLOWED below); SLURM_TASK_PID must be the task's own pid on both sides. Run
# once under each MPI plugin that sets rank variables: pmi2 (PMI_RANK, PMI_SIZE) and pmix
# (PMIX_RANK).
# timeout: 60
# lane: side
set -euo pipefail
# shellcheck source=slurm_client_common.sh
. "$(dirname "$0")/slurm_client_common.sh"

nodes=2
gpus=2
cpus_per_gpu=2
world=$((nodes * gpus))

# Variables that differ between any two steps, and why; every other one must be equal.
ALLOWED=(
    SLURM_STEP_ID SLURM_STEPID   # the reference is step 0, the rendezvousd step 1
    SLURM_SRUN_COMM_PORT         # each srun listens on a port of its own
    SLURM_STEP_LAUNCHER_PORT     # the same port, the new name
    SLURM_TASK_PID               # a pid: checked below to be the task's own, on both sides
    PMI_FD                       # pmi2: the task's own descriptor to its step's server
    PMI_JOBID                    # pmi2: "JOB.STEP"
    PMIX_NAMESPACE               # pmix: "slurm.pmix.JOB.STEP"
    SLURM_PMIXP_ABORT_AGENT_PORT # pmix: the port of the step's srun's abort agent
    PMIX_SERVER_URI2 PMIX_SERVER_URI21 PMIX_SERVER_URI3 PMIX_SERVER_URI4 PMIX_SERVER_URI41
    PMIX_SERVER_TMPDIR           # pmix: the step's server: its pid, port and directory
    PMIX_DSTORE_21_BASE_PATH     # pmix: under the step's server directory
    PMIX_DSTORE_ESH_BASE_PATH
)
declare -A allowed=()
for v in "${ALLOWED[@]}"; do
    allowed[$v]=1
done

# The rank writes its pid ($$: sh is the rank process, exec'd by the shim) and its
# environment, NUL-separated as env -0 writes it.
# shellcheck disable=SC2016 # expanded by each rank
run job.sh emit.err --emit-sbatch -N "$nodes" --gpus-per-node "$gpus" \
    --cpus-per-gpu "$cpus_per_gpu" -J taskenv -- sh -c \
    'echo $$ >"$GPURUN_JOB_DIR/rank-$RANK.pid"; env -0 >"$GPURUN_JOB_DIR/rank-$RANK.env"'
expect_rc "gpurun --emit-sbatch" 0
grep -q '^srun --ntasks-per-node=1 ' job.sh || grs_fail "the script has no 'srun --ntasks-per-node=1' line"
# The reference step, before the script's srun: what the ranks' tasks would be under srun.
# shellcheck disable=SC2016 # expanded in the batch script and by each task
ref='srun -n '$world' --ntasks-per-node='$gpus' --cpus-per-task='$cpus_per_gpu' sh -c '\''echo $$ >"$0/ref-$SLURM_PROCID.pid"; env -0 >"$0/ref-$SLURM_PROCID.env"'\'' "$dir"'
awk -v ref="$ref" '/^srun --ntasks-per-node=1 / { print ref } { print }' job.sh >taskenv.sh
grep -qxF "$ref" taskenv.sh || grs_fail "the reference step is not in the edited script"

# load FILE ARRAY: the SLURM*, PMI_* and PMIX_* variables of env -0 output FILE into the
# associative array named ARRAY.
# shellcheck disable=SC2034 # into is a reference: what it fills is the caller's array
load() {
    local -n into=$2
    local kv
    into=()
    while IFS= read -r -d '' kv; do
        case $kv in
        SLURM* | PMI_* | PMIX_*) into[${kv%%=*}]=${kv#*=} ;;
        esac
    done <"$1"
}

# compare MPI: submits the edited script with SLURM_MPI_TYPE=MPI (srun's default plugin for
# both steps) and compares every rank with its reference task.
compare() {
    local mpi=$1 id state dir r name bad=0 t0
    local -A want got
    t0=$(grs_now_ms)
    id=$(SLURM_MPI_TYPE=$mpi sbatch --parsable taskenv.sh) || grs_fail "sbatch ($mpi) failed"
    state=$(grs_job_wait "$id" 60) || grs_fail "job $id ($mpi) did not end within 60 s"
    echo "# job_ms[$mpi]=$(($(grs_now_ms) - t0))"
    [ "$state" = COMPLETED ] || grs_fail "job $id ($mpi) is $state: $(tail -n 5 "$GPURUN_JOBS/$id.out")"
    dir=$GPURUN_JOBS/$id
    for ((r = 0; r < world; r++)); do
        for f in "ref-$r.env" "ref-$r.pid" "rank-$r.env" "rank-$r.pid"; do
            [ -s "$dir/$f" ] || grs_fail "job $id ($mpi): no $f in the job dir"
        done
        load "$dir/ref-$r.env" want
        load "$dir/rank-$r.env" got
        [ "${want[SLURM_PROCID]:-}" = "$r" ] ||
            grs_fail "job $id ($mpi): ref-$r.env has SLURM_PROCID '${want[SLURM_PROCID]:-}'"
        [ "${want[SLURM_TASK_PID]:-}" = "$(cat "$dir/ref-$r.pid")" ] ||
            grs_fail "reference task $r: SLURM_TASK_PID '${want[SLURM_TASK_PID]:-}', its pid $(cat "$dir/ref-$r.pid")"
        [ "${got[SLURM_TASK_PID]:-}" = "$(cat "$dir/rank-$r.pid")" ] ||
            grs_fail "rank $r ($mpi): expected SLURM_TASK_PID $(cat "$dir/rank-$r.pid") (its pid), got '${got[SLURM_TASK_PID]:-}'"
        # The plugin's rank variable is there: the comparison below covers it.
        case $mpi in
        pmi2) [ "${want[PMI_RANK]:-}" = "$r" ] || grs_fail "reference task $r has no PMI_RANK $r" ;;
        pmix) [ "${want[PMIX_RANK]:-}" = "$r" ] || grs_fail "reference task $r has no PMIX_RANK $r" ;;
        esac
        for name in $(printf '%s\n' "${!want[@]}" "${!got[@]}" | sort -u); do
            [ -z "${allowed[$name]:-}" ] || continue
            if [ "${want[$name]-<unset>}" != "${got[$name]-<unset>}" ]; then
                echo "rank $r ($mpi): $name: srun gives '${want[$name]-<unset>}', gpurun '${got[$name]-<unset>}'"
                bad=$((bad + 1))
            fi
        done
    done
    [ "$bad" = 0 ] || grs_fail "$bad variables of the ranks differ from srun's ($mpi)"
    echo "# $mpi: ${#want[@]} variables of each of $world ranks as srun gives them"
}

compare pmi2
compare pmix
echo "# Slurm's per-task variables of a 2x2 job equal srun --ntasks-per-node=2's"
