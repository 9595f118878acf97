#!/bin/bash
# The collectives' tcp ring when a rank goes away: tests/coll_rank die (the last rank leaves
# right after the ring is up, as a crash would) and stall (it keeps its connections but stops
# taking part; the others run with a 1 s timeout). Every other rank's allreduce must fail
# within seconds with a message naming a peer, never hang, and the next call must give the
# same error. With 2 and 3 ranks, with the links through shared memory (the default on one
# machine, where a dead peer is seen on the TCP connection beside the ring) and over TCP.
# timeout: 120
set -euo pipefail

# shellcheck source=prologue.sh
. "$(dirname "$0")/prologue.sh"
fail_show=(gpurun.out gpurun.err)
need_built gpurun rendezvousd tests/coll_rank

# run MODE NPROCS SHM: every rank but the last must report the error it saw.
run() {
    local mode=$1 nprocs=$2 shm=$3 rc=0 r t0 ms pattern
    t0=$(date +%s%N)
    GPURUN_COLL_SHM=$shm timeout -k 5 30 "$build/gpurun" --local --gpus-per-node "$nprocs" \
        --job-dir "$work/$mode$nprocs-$shm" -- "$build/tests/coll_rank" "$mode" \
        >"$work/gpurun.out" 2>"$work/gpurun.err" </dev/null || rc=$?
    ms=$((($(date +%s%N) - t0) / 1000000))
    echo "# ${mode}_${nprocs}_shm${shm}_job_ms=$ms"
    if [ "$shm" = 1 ]; then
        grep -q "^\[0\] rank 0/$nprocs: tcp ring .* over shared memory, from .* over shared memory$" \
            "$work/gpurun.out" || fail "$mode with $nprocs ranks: rank 0's links are not shared"
    fi
    [ "$rc" != 124 ] || fail "$mode with $nprocs ranks: gpurun did not finish within 30 s"
    [ "$rc" = 0 ] || fail "$mode with $nprocs ranks: gpurun exited with status $rc, not 0"
    for ((r = 0; r < nprocs - 1; r++)); do
        if [ "$mode" = die ]; then
            pattern="closed the connection|cannot send to rank .*: connection (reset|closed)"
        else
            pattern="no data from rank|took nothing|closed the connection"
        fi
        grep -qE "^\[$r\] rank $r/$nprocs: error seen: .*($pattern)" "$work/gpurun.out" ||
            fail "$mode with $nprocs ranks: rank $r reported no error of the kind expected"
    done
    grep -E '^\[[0-9]+\] rank [0-9]+/[0-9]+: error seen' "$work/gpurun.out" | sed 's/^/# /'
}

for shm in 1 0; do
    run die 2 "$shm"
    run die 3 "$shm"
    run stall 2 "$shm"
    run stall 3 "$shm"
done
