#!/bin/bash
# The rank library under PMIx on the Slurm test cluster, with no rendezvousd: srun --mpi=pmix
# starts tests/gr_example (an id from rank 0 read by all, addresses across a barrier) on two
# nodes, and tests/gr_pmix_check (place, store and barrier semantics, errors) on three; then
# a user's own batch script runs gr_example through its inner srun. Every rank must print its
# line with the place Slurm gave it.
# timeout: 180
# lane: side
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/slurm/lib.sh
. "$here/../slurm/lib.sh"

grs_test_begin tests/gr_example tests/gr_pmix_check
cd "$GRS_WORK"
example=$GRS_BUILD/tests/gr_example

# check_example FILE NNODES NPROCS: FILE holds every rank's line of gr_example, rank-major
# over the nodes as srun's block distribution places them, and nothing else of that kind.
check_example() {
    local file=$1 nnodes=$2 nprocs=$3 world r line
    world=$((nnodes * nprocs))
    for ((r = 0; r < world; r++)); do
        line="rank $r/$world local $((r % nprocs)) node $((r / nprocs)): store ok, barrier ok"
        grep -qxF "$line" "$file" || grs_fail "$file lacks '$line'"
    done
    [ "$(grep -c 'store ok, barrier ok' "$file")" = "$world" ] ||
        grs_fail "$file has not exactly $world rank lines"
}

t0=$(grs_now_ms)
timeout 60 srun --mpi=pmix -N2 --ntasks-per-node=2 "$example" --steps 3 >example.out 2>example.err ||
    grs_fail "srun of gr_example failed: $(tail -n 5 example.err)"
echo "# srun_example_ms=$(($(grs_now_ms) - t0))"
check_example example.out 2 2

t0=$(grs_now_ms)
timeout 120 srun --mpi=pmix -N3 --ntasks-per-node=2 "$GRS_BUILD/tests/gr_pmix_check" \
    >check.out 2>check.err || grs_fail "srun of gr_pmix_check failed: $(tail -n 5 check.err)"
echo "# srun_check_ms=$(($(grs_now_ms) - t0))"
for ((r = 0; r < 6; r++)); do
    line="gr_pmix_check: rank $r/6 local $((r % 2)) node $((r / 2)): ok"
    grep -qxF "$line" check.out || grs_fail "check.out lacks '$line'"
done

# A batch script of the user's own: srun --mpi=pmix inside it, no gpurun anywhere.
job=$(sbatch --parsable -N2 --ntasks-per-node=2 -o batch-%j.out \
    --wrap "srun --mpi=pmix $example --steps 2")
state=$(grs_job_wait "$job" 60) || grs_fail "batch job $job did not end within 60 s"
[ "$state" = COMPLETED ] || grs_fail "batch job $job ended $state: $(tail -n 5 "batch-$job.out")"
check_example "batch-$job.out" 2 2
echo "# gr_example and gr_pmix_check under srun --mpi=pmix, and in a batch script: ok"
