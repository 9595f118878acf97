#!/bin/bash
# --emit-sbatch on the Slurm test cluster: the script gpurun would submit passes shellcheck,
# prints nothing else and creates nothing; submitted by hand with sbatch (twice: each run
# makes a job dir of its own) it runs every rank on the nodes asked for, and gpurun status
# and logs know the jobs as their own.
# timeout: 120
# lane: side
set -euo pipefail
# shellcheck source=slurm_client_common.sh
. "$(dirname "$0")/slurm_client_common.sh"

# shellcheck disable=SC2016 # expanded by each rank
run job.sh emit.err --emit-sbatch -N 2 --gpus-per-node 2 -t 5 -J "hand made" -- sh -c \
    'echo "rank $RANK of $WORLD_SIZE on $(hostname) gpu $CUDA_VISIBLE_DEVICES"'
expect_rc "gpurun --emit-sbatch" 0
[ ! -s emit.err ] || grs_fail "--emit-sbatch wrote to stderr: $(cat emit.err)"
head -n 1 job.sh | grep -qxF '#!/bin/bash' || grs_fail "the script does not start with #!/bin/bash"
for d in '--job-name="hand made"' --nodes=2 --ntasks-per-node=1 --gpus-per-node=2 \
    --time=0:05:00 --no-requeue --comment=gpurun; do
    grep -qxF "#SBATCH $d" job.sh || grs_fail "the script lacks '#SBATCH $d'"
done
grep -qx 'set -euo pipefail' job.sh || grs_fail "the script does not set -euo pipefail"
if command -v shellcheck >/dev/null; then
    shellcheck job.sh || grs_fail "the emitted script fails shellcheck"
fi
[ -z "$(squeue -h -o %A)" ] || grs_fail "--emit-sbatch submitted a job"

ids=
for n in 1 2; do
    id=$(sbatch --parsable job.sh) || grs_fail "sbatch of the emitted script failed"
    state=$(grs_job_wait "$id" 60) || grs_fail "job $id did not end within 60 s"
    [ "$state" = COMPLETED ] || grs_fail "job $id (run $n) is $state: $(cat "$GPURUN_JOBS/$id.out")"
    for r in 0 1 2 3; do
        line="[$r] rank $r of 4 on node$((r / 2 + 1)) gpu 0,1"
        grep -qxF "$line" "$GPURUN_JOBS/$id.out" || grs_fail "job $id's output lacks '$line'"
    done
    cmp -s job.sh "$GPURUN_JOBS/$id/job.sbatch" || grs_fail "job $id's job.sbatch is not the script"
    ids+=" $id"
done
for id in $ids; do
    run st.txt st.err status "$id"
    expect_rc "gpurun status $id" 0
    grep -qxF "job: $id (hand made)" st.txt || grs_fail "status of $id: $(head -n 1 st.txt)"
    grep -qxF "state: COMPLETED, exit status 0" st.txt || grs_fail "status of $id: $(sed -n 2p st.txt)"
    run logs.out logs.err logs "$id" --rank 3
    expect_rc "gpurun logs $id" 0
done
run list.txt list.err status
for id in $ids; do
    grep -qE "^$id +hand made +COMPLETED " list.txt || grs_fail "the job list lacks $id: $(cat list.txt)"
done
echo "# --emit-sbatch: shellcheck clean, runs twice under sbatch, known to status and logs"
