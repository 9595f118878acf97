#!/usr/bin/env bash
# What `make run` shows after building: a GPT-2 trained on this machine's CPUs by two ranks of
# one `gpurun --local` job (jobs/tiny.cfg), with its progress as it goes and a text sample at
# the end; then the job's summary read back from its job dir.
#
# Each demo trains from step 0 in an out_dir of its own (DEMO_OUT_DIR), beside its job dir:
# run twice, it trains twice, and the first run's checkpoints stay where they were (a run never
# deletes checkpoints; in the job file's out_dir the second run would only find the first one
# finished and resume it with nothing left to do).
#
# The temp dir goes when the demo ends, with the link to its job dir from the jobs root
# (DEMO_KEEP=1 keeps both).
#
# Parameters (environment): BUILD (build dir, default build), GPUS_PER_NODE (ranks, default
# 2), DEMO_JOB_DIR (default: job in a fresh temp dir), DEMO_OUT_DIR (the run's checkpoints and
# metrics.jsonl; default: out in that temp dir), DEMO_CFG (default jobs/tiny.cfg), DEMO_KEEP,
# and any `section.key=value` overrides as arguments (e.g. scripts/demo.sh train.steps=100).
set -euo pipefail

cd "$(dirname "$0")/.."
build=${BUILD:-build}
per_node=${GPUS_PER_NODE:-2}
cfg=${DEMO_CFG:-jobs/tiny.cfg}
tmp=
if [ -z "${DEMO_JOB_DIR:-}" ] || [ -z "${DEMO_OUT_DIR:-}" ]; then
    tmp=$(mktemp -d "${TMPDIR:-/tmp}/gpurun-demo.XXXXXX")
fi
keep=${DEMO_KEEP:-}

# The temp dir, and the jobs root's link (named by the job's id) to the job dir in it.
# shellcheck disable=SC2317 # run by the trap below
remove_tmp() {
    local id link
    [ -n "$tmp" ] && [ -z "$keep" ] || return 0
    id=$(sed -n 's/^  "job_id": "\(.*\)",$/\1/p' "$tmp/job/job.json" 2>/dev/null || true)
    link=${GPURUN_JOBS:-$HOME/.gpurun/jobs}/$id
    if [ -n "$id" ] && [ -L "$link" ] && [ "$(readlink -f "$link")" = "$(readlink -f "$tmp/job")" ]; then
        rm -f "$link"
    fi
    rm -rf "$tmp"
}
trap remove_tmp EXIT
job_dir=${DEMO_JOB_DIR:-$tmp/job}
out_dir=${DEMO_OUT_DIR:-$tmp/out}
# A train.out_dir among the overrides is the one the run uses (the later override wins).
for a in "$@"; do
    case $a in train.out_dir=*) out_dir=${a#train.out_dir=} ;; esac
done

for p in gpurun rendezvousd gpurun-train; do
    if [ ! -x "$build/$p" ]; then
        echo "demo: '$build/$p' is not built; run 'make' first" >&2
        exit 1
    fi
done

echo "Preparing the demo corpus (scripts/prep-demo-data.sh: the coreutils manual and Debian's"
echo "licence texts as byte-level token shards in $build/data/demo)..."
BUILD=$build scripts/prep-demo-data.sh
echo

cat <<TXT
gpurun demo: a byte-level GPT-2 ($cfg) trained on this machine, no Slurm.

  $build/gpurun --local --gpus-per-node $per_node $cfg ${*:+$* }train.out_dir=$out_dir

gpurun reads the job file's [job] section, writes the job dir, and starts rendezvousd,
which starts $per_node ranks of gpurun-train with RANK, WORLD_SIZE, MASTER_ADDR... The ranks
find each other through the daemon's store, join a ring for the gradient allreduce, and each
trains on its slice of every global batch. Rank 0 prints a line every few steps
(metrics.jsonl gets every step), validates, saves checkpoints and ends with a sample. Each
rank's output comes back prefixed "[RANK] ". While it runs, try in another terminal:

  $build/gpurun status --job-dir $job_dir

TXT

rc=0
"$build/gpurun" --local --gpus-per-node "$per_node" --job-dir "$job_dir" "$cfg" \
    "$@" train.out_dir="$out_dir" || rc=$?
echo
echo "gpurun exited with status $rc. What the leader wrote at the end (gpurun status):"
echo
"$build/gpurun" status --job-dir "$job_dir" | sed 's/^./  &/'
echo
if [ -n "$tmp" ] && [ -z "$keep" ]; then
    echo "The demo's temp dir $tmp is removed: DEMO_KEEP=1 keeps it (the job dir and"
    echo "the checkpoints, from which a larger train.steps goes on)."
else
    echo "Checkpoints and metrics.jsonl: $out_dir (the same gpurun command with that"
    echo "train.out_dir and a larger train.steps goes on from the last checkpoint)."
fi
exit "$rc"
