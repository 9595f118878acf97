#!/bin/bash
# The collectives' tcp ring with real ranks: `gpurun --local` runs tests/coll_rank check
# (allreduce sums of many sizes checked exactly and against the ring's documented order,
# avg and f64 sums, broadcast from every root, barriers, every rank's results hashed and
# compared through the store) with 1, 2, 3 and 4 ranks on one node and 2x2 ranks on two local
# nodes; the 3-rank job runs twice and must give the same hash (bitwise the same results run
# to run).
# timeout: 240
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
build=${BUILD:-build}
[[ $build == /* ]] || build=$root/$build

skip() {
    echo "# SKIP $*"
    exit 77
}
fail() {
    echo "FAIL: $*"
    for f in "$work/gpurun.out" "$work/gpurun.err"; do
        [ -s "$f" ] || continue
        echo "# --- ${f##*/} (last 30 lines)"
        tail -n 30 "$f" | sed 's/^/# /'
    done
    exit 1
}

for p in gpurun rendezvousd tests/coll_rank; do
    [ -x "$build/$p" ] || skip "'$build/$p' is not built"
done

work=$(mktemp -d "${TEST_TMPDIR:-${TMPDIR:-/tmp}}/gr-coll-test.XXXXXX")
cleanup() {
    local rc=$?
    if { [ "$rc" = 0 ] || [ "$rc" = 77 ]; } && [ -z "${TEST_KEEP_TMPDIR:-}" ]; then
        rm -rf "$work"
    else
        echo "# scratch kept: $work"
    fi
    exit "$rc"
}
trap cleanup EXIT

# run NAME NNODES NPROCS: one job of coll_rank check; sets hash to rank 0's.
run() {
    local name=$1 nnodes=$2 nprocs=$3 rc=0 world r line t0
    world=$((nnodes * nprocs))
    t0=$(date +%s%N)
    timeout -k 5 120 "$build/gpurun" --local --nodes "$nnodes" --gpus-per-node "$nprocs" \
        --job-dir "$work/$name" -- "$build/tests/coll_rank" check \
        >"$work/gpurun.out" 2>"$work/gpurun.err" </dev/null || rc=$?
    echo "# ${name}_job_ms=$((($(date +%s%N) - t0) / 1000000))"
    [ "$rc" != 124 ] || fail "$name: gpurun did not finish within 120 s"
    [ "$rc" = 0 ] || fail "$name: gpurun exited with status $rc, not 0"
    for ((r = 0; r < world; r++)); do
        line="rank $r/$world: all checks passed"
        grep -qxF "[$r] $line" "$work/gpurun.out" || fail "$name: output lacks '[$r] $line'"
    done
    hash=$(sed -n 's/^\[0\] hash \([0-9a-f]\{16\}\)$/\1/p' "$work/gpurun.out")
    [ -n "$hash" ] || fail "$name: rank 0 printed no hash"
    echo "# $name: $world ranks on $nnodes node(s): allreduce, broadcast, barrier ok (hash $hash)"
}

run one_rank 1 1
run two_ranks 1 2
run three_ranks 1 3
first=$hash
run three_ranks_again 1 3
[ "$hash" = "$first" ] || fail "the same 3-rank job gave hash $hash, then $first"
run four_ranks 1 4
run two_nodes 2 2
