#!/usr/bin/env bash
# bench/spares.sh GPURUN REPS: a node lost mid-run, timed from the SIGKILL of node 1's
# rendezvousd (gpurun --local, 2 nodes of 2 ranks):
#  - with a spare (--spare-nodes 1 --max-restarts 1): until every rank of the next generation
#    runs (each writes the wall clock as its first act), the restart's 1 s backoff included;
#  - without one: until gpurun has exited (the job ends: nothing can take the node's place).
# Prints markdown rows: median, min and max in ms over REPS runs.
set -euo pipefail

gpurun=$1
reps=${2:-5}
scratch=$(mktemp -d "${TMPDIR:-/tmp}/gr-spares.XXXXXX")
trap 'rm -rf "$scratch"' EXIT

cat >"$scratch/rank.sh" <<'EOF'
date +%s%N >"$STAMPS/g$GPURUN_RESTART_COUNT.r$RANK"
echo up
exec sleep 60
EOF

# node_pid DIR K: the rendezvousd of node K of the job in DIR.
node_pid() {
    local p
    for p in $(pgrep -f -- "--node-rank $2( |$)" || true); do
        if tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | grep -qF -- "$1"; then
            echo "$p"
            return 0
        fi
    done
}

# wait_files DIR PATTERN N: until N files match, 30 s at most.
wait_files() {
    local i
    for ((i = 0; i < 3000; i++)); do
        [ "$(find "$1" -name "$2" | wc -l)" -ge "$3" ] && return 0
        sleep 0.01
    done
    return 1
}

# one SPARES: one run; prints the ms from the kill to the event.
one() {
    local spares=$1 dir stamps gp pid t0 t1 gpargs=()
    dir=$(mktemp -d "$scratch/job.XXXXXX")
    stamps=$dir/stamps
    mkdir -p "$stamps"
    [ "$spares" = 1 ] && gpargs=(--spare-nodes 1)
    STAMPS=$stamps timeout -k 5 60 "$gpurun" --local -N 2 --gpus-per-node 2 --max-restarts 1 \
        --kill-grace 1 "${gpargs[@]}" --job-dir "$dir/job" -- sh "$scratch/rank.sh" \
        >"$dir/out" 2>"$dir/err" </dev/null &
    gp=$!
    wait_files "$stamps" 'g0.*' 4 || { echo "generation 0 did not start" >&2; return 1; }
    pid=$(node_pid "$dir/job" 1)
    [ -n "$pid" ] || { echo "no daemon of node 1" >&2; return 1; }
    t0=$(date +%s%N)
    kill -KILL "$pid"
    if [ "$spares" = 1 ]; then
        wait_files "$stamps" 'g1.*' 4 || { echo "generation 1 did not start" >&2; return 1; }
        t1=$(cat "$stamps"/g1.* | sort -n | tail -n 1)
        kill -TERM "$gp" 2>/dev/null || true
        wait "$gp" 2>/dev/null || true
    else
        wait "$gp" 2>/dev/null || true
        t1=$(date +%s%N)
    fi
    echo $(((t1 - t0) / 1000000))
}

row() {
    local what=$1 spares=$2 v=()
    for ((i = 0; i < reps; i++)); do
        v+=("$(one "$spares")")
    done
    printf '%s\n' "${v[@]}" | sort -n | awk -v what="$what" '{ a[NR] = $1 }
        END { printf "| %s | %d | %d | %d |\n", what, a[int((NR + 1) / 2)], a[1], a[NR] }'
}

echo "| node 1 of 2 lost (SIGKILL of its rendezvousd) | median ms | min | max |"
echo "|---|---:|---:|---:|"
row "with a spare: until the next generation's 4 ranks run (1 s backoff included)" 1
row "without a spare: until gpurun has exited (the job ends)" 0
