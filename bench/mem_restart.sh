#!/usr/bin/env bash
# bench/mem_restart.sh GPURUN GPURUN_TRAIN REPS [slurm]: a node lost mid-training, and what the restart
# costs with disk checkpoints against memory checkpoints. gpurun-train (CPU, jobs/tiny.cfg's
# model: 0.84M parameters, a 10 MB state) on gpurun --local, 2 nodes of 1 rank and a spare
# (--spare-nodes 1 --max-restarts 1); once the ranks pass step KILL_AT, node 1's rendezvousd is
# SIGKILLed, and the spare takes its place. Per case, REPS runs, the median (min, max):
#  - kill -> training: from the SIGKILL until rank 0 prints the restarted generation's first
#    step (the restart's 1 s backoff, the new ranks' start, the state's load);
#  - steps lost: the last step printed before the kill, less the step the restart resumed at;
#  - state read: the bytes rank 0 loaded, and from where.
# The cases: disk checkpoints every 200 steps, no memory ones (train.mem_ckpt_every = 0);
# memory checkpoints every 10 steps, disk ones every 200 (both with train.regroup = false);
# in process (train.regroup = true: rank 0 keeps its process and regroups). Then the cost of memory checkpoints on an undisturbed run: the time of
# one save (rank 0's first, as it prints it) against the time of a step, as a share of the
# step time at every 100 steps (the default) and every 10.
# With "slurm", the same on the Slurm test cluster (tests/slurm/up.sh, its own instance; the
# memory checkpoints' cost is not measured again there). Prints markdown tables; exits 77 with
# "# SKIP <reason>" where the cluster cannot run.
set -euo pipefail

gpurun=$(realpath "$1")
train=$(realpath "$2")
reps=${3:-3}
mode=${4:-local}
KILL_AT=355
STEPS=500
scratch=$(mktemp -d "${TMPDIR:-/tmp}/gr-memrestart.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
if [ "$mode" = slurm ]; then
    here=$(cd "$(dirname "$0")" && pwd)
    export GR_SLURM_ID=${BENCH_SLURM_ID:-42}
    # shellcheck source=tests/slurm/lib.sh
    . "$here/../tests/slurm/lib.sh"
    rc=0
    grs_check >/dev/null || rc=$?
    if [ "$rc" != 0 ]; then
        grs_check || true
        exit "$rc"
    fi
    trap 'grs_down >/dev/null 2>&1 || true; rm -rf "$scratch"' EXIT
    "$here/../tests/slurm/up.sh" >"$scratch/up.log" 2>&1 || {
        echo "the Slurm test cluster did not start: $(tail -n 1 "$scratch/up.log")" >&2
        exit 1
    }
    # shellcheck source=/dev/null
    . "$GRS_DIR/env.sh"
    export GPURUN_JOBS=$scratch/jobs
fi

texts=()
while IFS= read -r f; do
    texts+=("$f")
done < <(find /usr/share/common-licenses -maxdepth 1 -type f | LC_ALL=C sort)
"$train" prep "${texts[@]}" -o "$scratch/data" >"$scratch/prep.out" 2>&1 ||
    { echo "prep failed: $(tail -n 1 "$scratch/prep.out")" >&2; exit 1; }

# cfg FILE MEM_EVERY CKPT_EVERY STEPS [REGROUP]: jobs/tiny.cfg's model, one thread a rank;
# REGROUP (default false): the healthy ranks regroup in process.
cfg() {
    cat >"$1" <<CFG
[model]
n_layer = 4
n_head = 4
n_embd = 128
seq_len = 128
vocab_size = 256

[data]
train = $scratch/data/train_*.bin
val = $scratch/data/val_*.bin

[optim]
lr = 3e-3
min_lr = 3e-4
warmup_steps = 20

[train]
batch_size = 4
steps = $4
eval_every = 0
ckpt_every = $3
mem_ckpt_every = $2
regroup = ${5:-false}
seed = 1337
threads = 1
sample_tokens = 0
log_every = 1
CFG
}

# node_pid DIR K: the rendezvousd of node K of the job in DIR (local), or of the Slurm job
# whose submission gpurun wrote to DIR/stdout.
node_pid() {
    local p id
    if [ "$mode" = slurm ]; then
        id=$(sed -n 's/^Submitted job \([0-9][0-9]*\)$/\1/p' "$1/stdout" | head -n 1)
        for p in $(pgrep -f "^[^ ]*rendezvousd --job-dir $GPURUN_JOBS/$id " || true); do
            if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "SLURM_NODEID=$2"; then
                echo "$p"
                return 0
            fi
        done
        return 0
    fi
    for p in $(pgrep -f -- "--node-rank $2( |$)" || true); do
        if tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | grep -qF -- "$1"; then
            echo "$p"
            return 0
        fi
    done
}

# metrics_step DIR: the step of the last line of DIR/metrics.jsonl, 0 before the first.
metrics_step() {
    tail -n 1 "$1/metrics.jsonl" 2>/dev/null | sed -nE 's/^\{"step": ([0-9]+),.*/\1/p' | grep . || echo 0
}

# one MEM_EVERY REGROUP: one run; prints "ms lost bytes from".
one() {
    local dir gp pid t0 t1 killed_at resumed bytes from i n lost regroup=$2
    dir=$(mktemp -d "$scratch/run.XXXXXX")
    cfg "$dir/train.cfg" "$1" 200 "$STEPS" "$2"
    if [ "$mode" = slurm ]; then
        timeout -k 5 150 "$gpurun" --wait -N 2 --gpus-per-node 1 --spare-nodes 1 --max-restarts 1 \
            --kill-grace 1 --log-level info "$dir/train.cfg" "train.out_dir=$dir/out" \
            >"$dir/stdout" 2>"$dir/stderr" </dev/null &
    else
        timeout -k 5 120 "$gpurun" --local -N 2 --gpus-per-node 1 --spare-nodes 1 --max-restarts 1 \
            --kill-grace 1 --log-level info --job-dir "$dir/job" "$dir/train.cfg" \
            "train.out_dir=$dir/out" >"$dir/stdout" 2>"$dir/stderr" </dev/null &
    fi
    gp=$!
    # Rank 0's metrics.jsonl, a line a step as it completes, is read where it is written (the
    # job's output reaches a Slurm submitter later, in batches): every observation from the
    # kill on is kept as "ns lines laststep", and the time to training again is found in them
    # once the run has said where it went on from.
    for ((i = 0; i < 6000; i++)); do
        [ "$(metrics_step "$dir/out")" -ge "$KILL_AT" ] && break
        sleep 0.01
    done
    [ "$mode" = slurm ] && pid=$(node_pid "$dir" 1) || pid=$(node_pid "$dir/job" 1)
    [ -n "$pid" ] || { echo "no daemon of node 1" >&2; return 1; }
    kill -KILL "$pid"
    t0=$(date +%s%N)
    killed_at=$(metrics_step "$dir/out")
    : >"$dir/obs"
    while kill -0 "$gp" 2>/dev/null; do
        echo "$(date +%s%N) $(wc -l <"$dir/out/metrics.jsonl") $(metrics_step "$dir/out")" >>"$dir/obs"
        sleep 0.002
    done
    wait "$gp" || { echo "gpurun exited $?: $(tail -n 3 "$dir/stderr")" >&2; return 1; }
    resumed=$(sed -nE -e "s/^\[0\] resuming from '.*' at step ([0-9]+)$/\1/p" \
        -e 's/^\[0\] resuming from the memory checkpoint of step [0-9]+ at step ([0-9]+)$/\1/p' \
        -e 's/^\[0\] regrouped in process as generation [0-9]+: going on from step ([0-9]+) \(the live state of rank 0\)$/\1/p' \
        "$dir/stdout" | tail -n 1)
    if grep -q '^\[0\] regrouped in process' "$dir/stdout"; then
        # Rank 0's parameters and both moments, to the spare's new rank.
        n=$(od -An -t u8 -j 56 -N 8 "$(find "$dir/out" -name 'ckpt_*.bin' | sort | tail -n 1)" | tr -d ' ')
        bytes=$((12 * n))
        from="rank 0's live state (the collectives)"
    elif grep -q '^\[0\] resuming from the memory checkpoint' "$dir/stdout"; then
        # The daemons' log: gpurun --local's stderr, a Slurm job's output.
        bytes=$(sed -nE "s/.*rank 0 takes its memory checkpoint 'ckpt' of step [0-9]+ \(([0-9]+) bytes\) from (.*)$/\1/p" \
            "$dir/stderr" "$dir/stdout" | tail -n 1)
        from=$(sed -nE "s/.*rank 0 takes its memory checkpoint 'ckpt' of step [0-9]+ \([0-9]+ bytes\) from (.*)$/\1/p" \
            "$dir/stderr" "$dir/stdout" | tail -n 1)
    elif [ -n "$resumed" ]; then
        # Pruned since (the run saved newer ones): every checkpoint of the model is this size.
        bytes=$(stat -c %s "$(find "$dir/out" -name 'ckpt_*.bin' | sort | tail -n 1)")
        from="disk"
    else
        resumed=0 bytes=0 from="nothing: step 0"
    fi
    # Training again: rank 0's first step past the one it went on from; after a restart, once
    # its metrics were cut back to that step (the line count fell), unless the restart went on
    # from the step it was killed at (a memory checkpoint of that very step): then nothing is
    # cut, and any later step is the new generation's.
    cut=0
    if [ "$regroup" = true ] || [ "$resumed" -ge "$killed_at" ]; then cut=1; fi
    t1=$(awk -v r="$resumed" -v cut="$cut" '
        { if ($2 < prev) cut = 1; prev = $2 }
        cut && $3 > r { print $1; exit }' "$dir/obs")
    [ -n "$t1" ] || { echo "no step after $resumed: $(tail -n 2 "$dir/obs")" >&2; return 1; }
    lost=$((killed_at - resumed))
    echo "$(((t1 - t0) / 1000000)) $((lost < 0 ? 0 : lost)) $bytes ${from// /_}"
}

# row WHAT MEM_EVERY REGROUP
row() {
    local what=$1 out=()
    for ((r = 0; r < reps; r++)); do
        out+=("$(one "$2" "$3")")
    done
    printf '%s\n' "${out[@]}" | awk -v what="$what" '
        { ms[NR] = $1; lost[NR] = $2; bytes = $3; from = $4 }
        function med(a, n,   i, j, t, b) {
            for (i = 1; i <= n; i++) b[i] = a[i]
            for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (b[j] < b[i]) { t = b[i]; b[i] = b[j]; b[j] = t }
            return b[int((n + 1) / 2)] " (" b[1] "-" b[n] ")"
        }
        END { gsub("_", " ", from)
              printf "| %s | %s | %s | %.1f MB from %s |\n", what, med(ms, NR), med(lost, NR), bytes / 1e6, from }'
}

where="gpurun --local"
[ "$mode" = slurm ] && where="the Slurm test cluster"
echo "| $where: node 1 of 2 lost at step ~$KILL_AT of $STEPS (SIGKILL of its rendezvousd), a spare | kill -> training, ms: median (min-max) | steps lost | state taken, from where |"
echo "|---|---:|---:|---|"
row "every rank restarts: disk checkpoints every 200 steps (mem_ckpt_every = 0)" 0 false
row "every rank restarts: memory checkpoints every 10 steps, disk every 200" 10 false
row "in process (train.regroup): rank 0 keeps running, the spare's rank takes its state" 10 true
[ "$mode" = slurm ] && exit 0

# The cost of memory checkpoints on an undisturbed run of 1 node of 2 ranks.
dir=$scratch/cost
mkdir -p "$dir"
cfg "$dir/train.cfg" 10 0 200
"$gpurun" --local --gpus-per-node 2 --job-dir "$dir/job" "$dir/train.cfg" "train.out_dir=$dir/out" \
    >"$dir/stdout" 2>"$dir/stderr" </dev/null ||
    { echo "the undisturbed run failed: $(tail -n 3 "$dir/stderr")" >&2; exit 1; }
save=$(sed -nE 's/^\[0\] memory checkpoint of step [0-9]+ \(([0-9.]+) MB in ([0-9]+) ms\).*/\1 \2/p' "$dir/stdout" | head -n 1)
done_line=$(sed -nE 's/^\[0\] done: ([0-9]+) steps in ([0-9.]+) s.*/\1 \2/p' "$dir/stdout")
if [ -z "$save" ] || [ -z "$done_line" ]; then
    echo "no save or done line: $(tail -n 3 "$dir/stdout")" >&2
    exit 1
fi
echo
echo "| memory checkpoint of rank 0's whole state (1 node of 2 ranks) | MB | save ms | step ms | share of the step time, every 100 steps (default) | every 10 |"
echo "|---|---:|---:|---:|---:|---:|"
# shellcheck disable=SC2086 # two numbers each
set -- $save $done_line
awk -v mb="$1" -v ms="$2" -v steps="$3" -v s="$4" 'BEGIN {
    step = s * 1000 / steps
    printf "| jobs/tiny.cfg model, 0.84M parameters | %.1f | %d | %.1f | %.2f%% | %.1f%% |\n", mb, ms, step, 100 * ms / (100 * step), 100 * ms / (10 * step) }'
