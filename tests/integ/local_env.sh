#!/usr/bin/env bash
# What ranks see under `gpurun --local`: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE and
# NODE_RANK of every rank, on one node and on two, each line of the merged stream prefixed
# "[R] "; --export reaching every rank; -o taking the merged stream to a file.
# timeout: 120
set -euo pipefail
# shellcheck source=local_common.sh
. "$(dirname "$0")/local_common.sh"

# shellcheck disable=SC2016 # expanded by the ranks' shell
show_env='echo "RANK=$RANK WORLD_SIZE=$WORLD_SIZE LOCAL_RANK=$LOCAL_RANK LOCAL_WORLD_SIZE=$LOCAL_WORLD_SIZE NODE_RANK=$NODE_RANK FOO=${FOO:-}"'

# check_ranks NODES PER_NODE FOO: every rank's line is there, once, with its values.
check_ranks() {
    local nodes=$1 per=$2 foo=$3 world r n
    world=$((nodes * per))
    for ((r = 0; r < world; r++)); do
        line="[$r] RANK=$r WORLD_SIZE=$world LOCAL_RANK=$((r % per)) LOCAL_WORLD_SIZE=$per NODE_RANK=$((r / per)) FOO=$foo"
        n=$(grep -cxF -- "$line" "$work/out" || true)
        [ "$n" = 1 ] || fail "'$line' appears $n times in the merged stream, not once"
    done
    n=$(grep -c . "$work/out" || true)
    [ "$n" = "$world" ] || fail "$n lines in the merged stream, expected $world"
}

t0=$(date +%s%N)
run --local --gpus-per-node 4 -- sh -c "$show_env"
t1=$(date +%s%N)
expect_rc 0 "4 ranks"
check_ranks 1 4 ""
echo "# 4 ranks on 1 node: $(((t1 - t0) / 1000000)) ms"

run --local --nodes 2 --gpus-per-node 2 --export FOO=bar -- sh -c "$show_env"
expect_rc 0 "2 nodes of 2 ranks"
check_ranks 2 2 bar

run --local -N 3 --gpus-per-node 1 --export FOO=a=b -- sh -c "$show_env"
expect_rc 0 "3 nodes of 1 rank"
check_ranks 3 1 a=b

# -o: the merged stream goes to the file, not to gpurun's stdout.
run --local --gpus-per-node 2 -o "$work/merged.txt" -- sh -c "$show_env"
expect_rc 0 "-o FILE"
[ ! -s "$work/out" ] || fail "-o FILE: lines still reached stdout"
cp "$work/merged.txt" "$work/out"
check_ranks 1 2 ""

# Ranks start in the directory gpurun was started in.
mkdir -p "$work/wd"
cd "$work/wd"
run --local -- sh -c 'pwd -P'
cd "$root"
expect_rc 0 "pwd"
expect_out_line "[0] $(cd "$work/wd" && pwd -P)"
# OpenMP threads: this machine's CPUs shared by every rank of the job, whichever emulated
# node it is on (not by one node's ranks: -N 2 on 2 CPUs gave 2 threads to each of 2 ranks).
cpus=$(nproc)
per=$((cpus / 2 > 0 ? cpus / 2 : 1))
# shellcheck disable=SC2016 # expanded by the ranks' shell
run --local -N 2 --gpus-per-node 1 -- sh -c 'echo "threads $OMP_NUM_THREADS"'
expect_rc 0 "OMP_NUM_THREADS"
[ "$(grep -c "threads $per\$" "$work/out" || true)" = 2 ] ||
    fail "expected OMP_NUM_THREADS=$per ($cpus CPUs, 2 ranks on 2 nodes) on every rank, got: $(cat "$work/out")"
# mpirun's variables, as a script written for `mpirun python3 train.py` reads them; MPICH's
# PMI-1 ones only with --mpi-env.
# shellcheck disable=SC2016 # expanded by the ranks' shell
mpi_env='echo "mpi $OMPI_COMM_WORLD_RANK/$OMPI_COMM_WORLD_SIZE local $OMPI_COMM_WORLD_LOCAL_RANK/$OMPI_COMM_WORLD_LOCAL_SIZE pmi ${PMI_RANK:-}/${PMI_SIZE:-}"'
run --local -N 2 --gpus-per-node 2 -- sh -c "$mpi_env"
expect_rc 0 "mpirun's variables"
expect_out_line "[3] mpi 3/4 local 1/2 pmi /"
run --local -N 2 --gpus-per-node 2 --mpi-env -- sh -c "$mpi_env"
expect_rc 0 "--mpi-env"
expect_out_line "[2] mpi 2/4 local 0/2 pmi 2/4"
# Open MPI itself is not misled by them: a rank's MPI_Init is a singleton, as without gpurun.
if [ -x "$build/tests/mpi_hello" ]; then
    run --local --gpus-per-node 2 -- "$build/tests/mpi_hello"
    expect_rc 0 "Open MPI's MPI_Init in a rank"
    [ "$(grep -c 'rank 0/1 on' "$work/out" || true)" = 2 ] ||
        fail "MPI_Init in ranks with OMPI_COMM_WORLD_*: $(cat "$work/out" "$work/err")"
fi
echo "# rank environment on 1, 2 and 3 nodes, --export and -o ok"
