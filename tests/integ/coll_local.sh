#!/bin/bash
# The collectives' tcp ring with real ranks: `gpurun --local` runs tests/coll_rank check
# (allreduce sums of many sizes checked exactly and against the ring's documented order,
# avg and f64 sums, broadcast from every root, barriers, every rank's results hashed and
# compared through the store) with 1, 2, 3 and 4 ranks on one node and 2x2 ranks on two local
# nodes, with the links between ranks of this machine through shared memory (the default) and
# over TCP (GPURUN_COLL_SHM=0). The same world size must give the same hash every time: the
# results are bitwise the same run to run and whatever the transport.
# timeout: 240
set -euo pipefail

# shellcheck source=prologue.sh
. "$(dirname "$0")/prologue.sh"
fail_show=(gpurun.out gpurun.err)
need_built gpurun rendezvousd tests/coll_rank

# run NAME NNODES NPROCS SHM: one job of coll_rank check with GPURUN_COLL_SHM=SHM; checks
# that every rank passed and that its links went over what SHM asks for (TCP with small_shm
# set), and that the hash is the one every earlier job of the same world size printed. The job
# runs under the command in wrap, if any.
declare -A hashes
wrap=()
small_shm=
run() {
    local name=$1 nnodes=$2 nprocs=$3 shm=$4 rc=0 world r line t0 link hash
    world=$((nnodes * nprocs))
    link="over shared memory"
    [ "$shm" = 1 ] && [ -z "$small_shm" ] || link="over tcp"
    t0=$(date +%s%N)
    GPURUN_COLL_SHM=$shm timeout -k 5 120 "${wrap[@]}" "$build/gpurun" --local --nodes "$nnodes" \
        --gpus-per-node "$nprocs" --job-dir "$work/$name" -- "$build/tests/coll_rank" check \
        >"$work/gpurun.out" 2>"$work/gpurun.err" </dev/null || rc=$?
    echo "# ${name}_job_ms=$((($(date +%s%N) - t0) / 1000000))"
    [ "$rc" != 124 ] || fail "$name: gpurun did not finish within 120 s"
    [ "$rc" = 0 ] || fail "$name: gpurun exited with status $rc, not 0"
    for ((r = 0; r < world; r++)); do
        line="rank $r/$world: all checks passed"
        grep -qxF "[$r] $line" "$work/gpurun.out" || fail "$name: output lacks '[$r] $line'"
        [ "$world" = 1 ] && continue
        line=$(grep -F "[$r] rank $r/$world: tcp ring of $world ranks: " "$work/gpurun.out") ||
            fail "$name: rank $r did not describe its ring"
        [ "$(grep -o "$link" <<<"$line" | wc -l)" = 2 ] ||
            fail "$name: rank $r's links are not both $link: $line"
    done
    hash=$(sed -n 's/^\[0\] hash \([0-9a-f]\{16\}\)$/\1/p' "$work/gpurun.out")
    [ -n "$hash" ] || fail "$name: rank 0 printed no hash"
    if [ -n "${hashes[$world]:-}" ] && [ "${hashes[$world]}" != "$hash" ]; then
        fail "$name: hash $hash, where an earlier job of $world ranks gave ${hashes[$world]}"
    fi
    hashes[$world]=$hash
    echo "# $name: $world ranks on $nnodes node(s), links $link: allreduce, broadcast," \
        "barrier ok (hash $hash)"
}

run one_rank 1 1 1
run two_ranks 1 2 1
run three_ranks 1 3 1
run three_ranks_again 1 3 1
run four_ranks 1 4 1
run two_nodes 2 2 1
run two_ranks_tcp 1 2 0
run three_ranks_tcp 1 3 0
run four_ranks_tcp 1 4 0
run two_nodes_tcp 2 2 0

# A /dev/shm too small for a shared ring (1 MiB for a ring of 4): the links fall back to TCP
# and every check passes. (The ring used to be made anyway, and the first copy past what the
# file system could hold died of SIGBUS.) Needs root for a mount namespace of its own.
if [ "$(id -u)" = 0 ] && unshare -m true 2>/dev/null; then
    wrap=(unshare -m sh -c 'mount -t tmpfs -o size=1m tmpfs /dev/shm && exec "$@"' sh)
    small_shm=1
    run two_ranks_small_shm 1 2 1
else
    echo "# small /dev/shm: skipped (needs root and unshare -m)"
fi
