#!/usr/bin/env bash
# sbatch's habits with `gpurun --local`, whose one node is the only meaning of a count in all:
# -n 4 and -G 2 run 4 and 2 ranks on it; --gres gpu:2 and gpu:TYPE:2 (the type is Slurm's)
# are --gpus-per-node 2, with -N 2 on each node; a --gres that contradicts --gpus-per-node is
# refused with one line, exit 125, nothing run.
# timeout: 60
set -euo pipefail
# shellcheck source=local_common.sh
. "$(dirname "$0")/local_common.sh"

# ranks OPTIONS...: runs a job of OPTIONS whose ranks print their place; checks exit 0.
ranks() {
    # shellcheck disable=SC2016 # expanded by each rank
    run --local "$@" -- sh -c 'echo "rank $RANK of $WORLD_SIZE local $LOCAL_RANK/$LOCAL_WORLD_SIZE node $NODE_RANK"'
    expect_rc 0 "gpurun --local $*"
}

ranks -n 4
for r in 0 1 2 3; do expect_out_line "[$r] rank $r of 4 local $r/4 node 0"; done
ranks -G 2
for r in 0 1; do expect_out_line "[$r] rank $r of 2 local $r/2 node 0"; done
ranks --gres gpu:2
for r in 0 1; do expect_out_line "[$r] rank $r of 2 local $r/2 node 0"; done
ranks --gres gpu:a100:2 -N 2
for r in 0 1 2 3; do expect_out_line "[$r] rank $r of 4 local $((r % 2))/2 node $((r / 2))"; done

run --local --gres gpu:2 --gpus-per-node 3 -- true
expect_rc 125 "--gres gpu:2 --gpus-per-node 3"
expect_err "gpurun: --gpus-per-node 3 and --gres gpu:2 differ: gpurun runs one rank per GPU, so both count the ranks per node (it starts a node's ranks itself); give one of them"
[ "$(wc -l <"$work/err")" = 1 ] || fail "more than one line: $(cat "$work/err")"
run --local -n 3 -N 2 -- true
expect_rc 125 "-n 3 -N 2"
expect_err "gpurun: --ntasks 3 cannot be split evenly over --nodes 2: gpurun runs as many ranks on every node; give a multiple of 2 (2 or 4)"
echo "# --local -n, -G, --gres gpu:N and gpu:TYPE:N run; a contradiction refused"
