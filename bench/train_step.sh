#!/bin/bash
# The CPU training-step benchmark: build/bench/train_step for the tiny model of jobs/tiny.cfg
# and a 6-layer/384-wide model at seq 256, with 1 and 2 OpenMP threads, next to the matmul
# throughput of the same machine on the same shapes. Prints two markdown tables (matmul
# GFLOP/s per shape; step time, tokens/s and the step against FLOPs / matmul throughput) and
# the verdict against the target (a step within 1.5x). Takes about half a minute here: three
# rounds over every case, the best of each measure kept, against bursts of other work.
#
# Environment (all optional):
#   BUILD                 build dir (default build/ of the source tree)
#   BENCH_STEP_THREADS    OpenMP thread counts (default 1,2)
#   BENCH_STEP_REPS       timed steps per row, the best reported (default 20 tiny, 10 6L/384)
#   BENCH_STEP_CFG        the tiny model's config (default jobs/tiny.cfg)
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${BUILD:-build}
[[ $BUILD == /* ]] || BUILD=$root/$BUILD
THREADS=${BENCH_STEP_THREADS:-1,2}
CFG=${BENCH_STEP_CFG:-}
if [ -n "$CFG" ]; then
    CFG=$(realpath -- "$CFG")
fi

if [ ! -x "$BUILD/bench/train_step" ]; then
    echo "train_step.sh: '$BUILD/bench/train_step' is not built (run 'make all')" >&2
    exit 1
fi
# From the source tree, so that the table names jobs/tiny.cfg as the repository does.
cd "$root"
args=(--threads "$THREADS" --cfg "${CFG:-jobs/tiny.cfg}")
if [ -n "${BENCH_STEP_REPS:-}" ]; then
    args+=(--reps "$BENCH_STEP_REPS")
fi
# OMP_NUM_THREADS would not matter (the program sets each count), but a bound affinity from
# the caller's environment could pin both threads to one core.
unset OMP_PROC_BIND GOMP_CPU_AFFINITY
exec "$BUILD/bench/train_step" "${args[@]}"
