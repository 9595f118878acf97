#!/bin/bash
# The rank library against the real daemons: `gpurun --local` runs tests/gr_example (a
# 128-byte binary id from rank 0 read back by every rank, addresses exchanged across a
# barrier, progress reports, a last barrier) with four ranks on one node, then on two local
# nodes of two, and every rank must print its line with the place the environment gave it,
# both in the merged output and in its own log.
set -euo pipefail

# shellcheck source=prologue.sh
. "$(dirname "$0")/prologue.sh"
fail_show=(gpurun.out gpurun.err)
need_built gpurun rendezvousd tests/gr_example

# run NAME NNODES NPROCS: one job, and the checks of every rank's line.
run() {
    local name=$1 nnodes=$2 nprocs=$3 rc=0 world r line log t0
    world=$((nnodes * nprocs))
    t0=$(date +%s%N)
    timeout -k 5 120 "$build/gpurun" --local --nodes "$nnodes" --gpus-per-node "$nprocs" \
        --job-dir "$work/$name" -- "$build/tests/gr_example" --steps 3 \
        >"$work/gpurun.out" 2>"$work/gpurun.err" || rc=$?
    echo "# ${name}_job_ms=$((($(date +%s%N) - t0) / 1000000))"
    [ "$rc" != 124 ] || fail "$name: gpurun did not finish within 120 s"
    [ "$rc" = 0 ] || fail "$name: gpurun exited with status $rc, not 0"
    for ((r = 0; r < world; r++)); do
        line="rank $r/$world local $((r % nprocs)) node $((r / nprocs)): store ok, barrier ok"
        grep -qxF "[$r] $line" "$work/gpurun.out" || fail "$name: output lacks '[$r] $line'"
        log=$(find "$work/$name" -name "rank-$r.log" -print -quit)
        [ -n "$log" ] || fail "$name: no logs/rank-$r.log in the job dir"
        grep -qxF "$line" "$log" || fail "$name: $log lacks '$line'"
    done
    [ "$(grep -c 'store ok, barrier ok' "$work/gpurun.out")" = "$world" ] ||
        fail "$name: not exactly $world rank lines in the output"
    echo "# $name: $world ranks on $nnodes node(s): store and barrier ok"
}

run one_node 1 4
run two_nodes 2 2
