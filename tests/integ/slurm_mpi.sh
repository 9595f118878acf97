#!/bin/bash
# OpenMPI on the Slurm test cluster: srun --mpi=pmix starts tests/mpi_hello directly (two
# nodes, then three), and a batch script runs it with OpenMPI's own mpirun; then mpi4py under
# srun --mpi=pmix. Every rank must print the right Allreduce sum, from the node Slurm put it
# on.
# timeout: 180
# lane: side
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/slurm/lib.sh
. "$here/../slurm/lib.sh"

grs_test_begin tests/mpi_hello
cd "$GRS_WORK"
hello=$GRS_BUILD/tests/mpi_hello

# check FILE WORLD HOSTS: WORLD lines "rank R/WORLD on HOST sum=S", one per rank, with S the
# sum of all ranks, on the hosts HOSTS (sorted, space-separated, one per rank).
check() {
    local file=$1 world=$2 hosts=$3 sum=$(($2 * ($2 - 1) / 2)) got
    [ "$(grep -c '^mpi_hello: rank ' "$file")" = "$world" ] ||
        grs_fail "$file has not $world rank lines: $(head -n 8 "$file")"
    for ((r = 0; r < world; r++)); do
        grep -qE "^mpi_hello: rank $r/$world on node[0-9]+ sum=$sum\$" "$file" ||
            grs_fail "$file lacks rank $r's line with sum=$sum"
    done
    got=$(sed -n 's/^mpi_hello: rank [0-9]*\/[0-9]* on \([^ ]*\) .*/\1/p' "$file" | sort | tr '\n' ' ')
    [ "$got" = "$hosts " ] || grs_fail "$file: ranks on '$got', expected '$hosts '"
}

t0=$(grs_now_ms)
timeout 60 srun --mpi=pmix -N2 --ntasks-per-node=2 "$hello" >two.out 2>two.err ||
    grs_fail "srun --mpi=pmix -N2 failed: $(tail -n 60 two.err; tail -n 20 two.out)"
echo "# srun_2x2_ms=$(($(grs_now_ms) - t0))"
check two.out 4 "node1 node1 node2 node2"

timeout 60 srun --mpi=pmix -N3 -n6 --ntasks-per-node=2 "$hello" >three.out 2>three.err ||
    grs_fail "srun --mpi=pmix -N3 failed: $(tail -n 60 three.err; tail -n 20 three.out)"
check three.out 6 "node1 node1 node2 node2 node3 node3"

# OpenMPI's own launcher inside an allocation (it starts its daemons through srun).
job=$(sbatch --parsable -N2 --ntasks-per-node=2 -o batch-%j.out \
    --wrap "mpirun --allow-run-as-root $hello")
state=$(grs_job_wait "$job" 90) || grs_fail "batch job $job did not end within 90 s"
[ "$state" = COMPLETED ] || grs_fail "batch job $job ended $state: $(tail -n 5 "batch-$job.out")"
check "batch-$job.out" 4 "node1 node1 node2 node2"
echo "# mpi_hello under srun --mpi=pmix on 2 and 3 nodes and under mpirun in a batch job: ok"

# mpi4py (Debian's python3-mpi4py) under srun --mpi=pmix: the world PMIx gives it, the
# launch README's frameworks table names for MPI programs (under gpurun each rank would be a
# singleton: tests/integ/local_alone.sh).
if /usr/bin/python3 -c 'import mpi4py' >/dev/null 2>&1; then
    timeout 60 srun --mpi=pmix -N2 --ntasks-per-node=2 /usr/bin/python3 -c '
import socket
from mpi4py import MPI
c = MPI.COMM_WORLD
print("mpi_hello: rank %d/%d on %s sum=%d" % (c.Get_rank(), c.Get_size(),
      MPI.Get_processor_name(), c.allreduce(c.Get_rank())), flush=True)' >py.out 2>py.err ||
        grs_fail "srun --mpi=pmix python3 (mpi4py) failed: $(tail -n 30 py.err; tail -n 10 py.out)"
    check py.out 4 "node1 node1 node2 node2"
    echo "# mpi4py under srun --mpi=pmix on 2 nodes: ok"
else
    echo "# mpi4py not importable (python3-mpi4py): its case not run"
fi
