#!/usr/bin/env bash
# What `make run` shows after building: one distributed job on this machine with
# `gpurun --local`, two rendezvousd "nodes" of two ranks each on loopback, then the job's
# summary and one rank's log read back from its job dir.
#
# Parameters (environment): BUILD (build dir, default build), NODES (default 2),
# GPUS_PER_NODE (ranks per node, default 2), DEMO_JOB_DIR (default: a fresh temp dir).
set -euo pipefail

cd "$(dirname "$0")/.."
build=${BUILD:-build}
nodes=${NODES:-2}
per_node=${GPUS_PER_NODE:-2}
job_dir=${DEMO_JOB_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/gpurun-demo.XXXXXX")/job}

for p in gpurun rendezvousd; do
    if [ ! -x "$build/$p" ]; then
        echo "demo: '$build/$p' is not built; run 'make' first" >&2
        exit 1
    fi
done

# The rank program: the rank library's example (store, binary id exchange, barriers,
# progress reports), or a shell that prints what any torch env:// program would read.
if [ -x "$build/tests/gr_example" ]; then
    cmd=("$build/tests/gr_example" --steps 5 --step-ms 50)
else
    # shellcheck disable=SC2016 # expanded by each rank's shell
    cmd=(sh -c 'echo "rank $RANK of $WORLD_SIZE (local $LOCAL_RANK of $LOCAL_WORLD_SIZE, node $NODE_RANK), master $MASTER_ADDR:$MASTER_PORT"')
fi

cat <<TXT
gpurun demo: a distributed job on this machine, no Slurm.

  $build/gpurun --local --nodes $nodes --gpus-per-node $per_node -- ${cmd[*]}

gpurun writes the job dir ($job_dir: key, job.json, logs/) and starts one
rendezvousd per node. Node 0's daemon is also the leader: it binds a free loopback port,
the others find it through endpoint.json, and once all $nodes nodes have joined every
daemon starts its $per_node ranks with RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT...
Each rank's output comes back prefixed "[RANK] ".

TXT

rc=0
"$build/gpurun" --local --nodes "$nodes" --gpus-per-node "$per_node" --job-dir "$job_dir" \
    -- "${cmd[@]}" || rc=$?
echo
echo "gpurun exited with status $rc. What the leader wrote at the end (gpurun status):"
echo
"$build/gpurun" status --job-dir "$job_dir" | sed 's/^./  &/'
echo
echo "Rank 0's log (gpurun logs --rank 0):"
"$build/gpurun" logs --job-dir "$job_dir" --rank 0 | sed 's/^./  &/'
exit "$rc"
