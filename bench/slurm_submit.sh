#!/bin/bash
# Submit-to-first-rank-line latency on the Slurm test cluster (tests/slurm/up.sh): a 2-node
# job of 2 ranks per node whose ranks print their clock (date +%s%N) as their first line,
# submitted by gpurun (libslurm, the generated script, one rendezvousd per node) and by a
# hand-written sbatch script whose inner srun sets torch's variables itself. The latency is
# the earliest rank's clock minus the clock just before the submitting command. It is split
# at the batch script's start, its first command's clock for both (bash's EPOCHREALTIME, no
# command run for it): gpurun's script keeps it (summary.json's script_started_ms, to the
# ms), the hand-written one prints it once its srun is done. Before it is Slurm's
# scheduling, the same for both; after it, the script's own work and the launcher's. (The
# job dir's file times would not do: they have the kernel's tick, 4 ms here.) Every job runs to its end, and the cluster is idle
# again, before the next is submitted.
#
# usage: bench/slurm_submit.sh LOADGEN GPURUN RUNS    (prints the table's rows; needs root)
# Exit status: 0, 77 when the cluster cannot run here ("# SKIP <reason>"), 1 on a failure.
set -euo pipefail

loadgen=$(realpath "$1") gpurun=$(realpath "$2") runs=$3
here=$(cd "$(dirname "$0")" && pwd)
# The benchmark's own cluster instance, beside any a test may have up.
export GR_SLURM_ID=${BENCH_SLURM_ID:-42}
# shellcheck source=tests/slurm/lib.sh
. "$here/../tests/slurm/lib.sh"

rc=0
grs_check >/dev/null || rc=$?
if [ "$rc" != 0 ]; then
    grs_check || true
    exit "$rc"
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/gr-bench-slurm.XXXXXX")
cleanup() {
    grs_down >/dev/null 2>&1 || true
    rm -rf "$work"
}
trap cleanup EXIT
"$here/../tests/slurm/up.sh" >"$work/up.log" 2>&1 || {
    echo "bench: the Slurm test cluster did not start: $(tail -n 1 "$work/up.log")" >&2
    exit 1
}
# shellcheck source=/dev/null
. "$GRS_DIR/env.sh"
cd "$work"
export GPURUN_JOBS=$work/jobs

# The hand-written anchor: what a user writes without gpurun for the same job.
cat >hand.sbatch <<'EOF'
#!/bin/bash
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=2
#SBATCH --gpus-per-node=2
#SBATCH --output=hand-%j.out
set -euo pipefail
t0=$EPOCHREALTIME
MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
export MASTER_ADDR MASTER_PORT=29500
# shellcheck disable=SC2016 # expanded by each task
srun bash -c 'export RANK=$SLURM_PROCID WORLD_SIZE=$SLURM_NTASKS LOCAL_RANK=$SLURM_LOCALID; exec date +%s%N'
echo "start $t0"
EOF

now_ns() {
    date +%s%N
}

# record T0 START FILE: from the rank clocks in FILE, appends to the current launcher's
# files (ms): first rank line - T0, first rank line - START (the batch script's start), last
# rank line - START.
record() {
    local t0=$1 start=$2 file=$3 first last
    [ -n "$start" ] || {
        echo "bench: no script start for $file" >&2
        return 1
    }
    [ "$(grep -cE '^(\[[0-9]\] )?[0-9]{19}$' "$file")" = 4 ] || {
        echo "bench: not 4 rank lines in $file: $(head -c 300 "$file")" >&2
        return 1
    }
    first=$(grep -E '^(\[[0-9]\] )?[0-9]{19}$' "$file" | grep -oE '[0-9]{19}' | sort -n | head -n 1)
    last=$(grep -E '^(\[[0-9]\] )?[0-9]{19}$' "$file" | grep -oE '[0-9]{19}' | sort -n | tail -n 1)
    awk -v a="$first" -v t="$t0" 'BEGIN { printf "%.1f\n", (a - t) / 1e6 }' >>"$label.submit"
    awk -v a="$first" -v t="$start" 'BEGIN { printf "%.1f\n", (a - t) / 1e6 }' >>"$label.first"
    awk -v a="$last" -v t="$start" 'BEGIN { printf "%.1f\n", (a - t) / 1e6 }' >>"$label.last"
}

# One warm-up of each (the first job of a fresh slurmctld pays for its caches).
"$gpurun" --wait -N 2 --gpus-per-node 2 -- true >/dev/null 2>&1 || true
sbatch --wait hand.sbatch >/dev/null 2>&1 || true

# Each submission finds the cluster idle: no job left, not even one completing.
idle() {
    local k
    for ((k = 0; k < 200; k++)); do
        [ -z "$(squeue -h -o %A)" ] && [ "$(sinfo -h -t idle -o %D)" = "$GR_SLURM_NODES" ] && return 0
        sleep 0.05
    done
    echo "bench: the cluster is not idle after 10 s: $(squeue -h)" >&2
    return 1
}

for ((i = 0; i < runs; i++)); do
    label=gpurun
    idle
    t0=$(now_ns)
    "$gpurun" --wait -N 2 --gpus-per-node 2 -- date +%s%N >"gpurun-$i.out" 2>"gpurun-$i.err" || {
        echo "bench: gpurun run $i failed: $(tail -n 1 "gpurun-$i.err")" >&2
        exit 1
    }
    id=$(sed -n 's/^Submitted job //p' "gpurun-$i.out")
    start=$(sed -n 's/^ *"script_started_ms": \([0-9]*\).*/\1000000/p' "$GPURUN_JOBS/$id/summary.json")
    record "$t0" "$start" "gpurun-$i.out"
    label=hand
    idle
    t0=$(now_ns)
    id=$(sbatch --parsable --wait hand.sbatch 2>"hand-$i.err") || {
        echo "bench: sbatch run $i failed: $(tail -n 1 "hand-$i.err")" >&2
        exit 1
    }
    start=$(sed -n 's/^start \([0-9]*\)[.,]\([0-9]*\)$/\1\2000/p' "hand-$id.out")
    record "$t0" "$start" "hand-$id.out"
done

row() {
    local name=$1 label=$2 med p90 min n first last
    read -r med p90 min n < <("$loadgen" stats <"$label.submit")
    read -r first _ < <("$loadgen" stats <"$label.first")
    read -r last _ < <("$loadgen" stats <"$label.last")
    echo "| $name | $n | $med | $p90 | $min | **$first** | $last |"
}
row "gpurun -N 2 --gpus-per-node 2 (libslurm, one rendezvousd per node)" gpurun
row "anchor: hand-written sbatch + srun script (sbatch CLI)" hand
