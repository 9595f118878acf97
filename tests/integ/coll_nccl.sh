#!/bin/bash
# The collectives' nccl backend with real ranks: `gpurun --local` runs tests/coll_rank
# nccl-check (device allreduce and reduce-scatter averages checked bitwise against exact sums,
# all-gathers, in place and not, f32 and bf16; the host
# operations through the staging buffer; every rank's results hashed and compared through the
# store) with 1, 2 and 3 ranks, one GPU each; nccl-die and nccl-stall (the last rank leaves,
# or stays but goes quiet: the others must fail within seconds with the communicator aborted,
# never hang); under cudasim also nccl-nojoin (the last rank never opens its collectives: the
# others' set-up fails naming it; with real NCCL that wait is COLL_TIMEOUT_MS_DEFAULT, 600 s,
# too long for this test).
#
# Real NCCL refuses two ranks on one GPU, so a world larger than the machine's device count is
# skipped with that reason. Without a device, the CUDA emulation's build of coll_rank runs
# the same checks where it is built (GPURUN_COLL_RANK_SIM, else $BUILD/sim/tests/coll_rank,
# or $BUILD/tests/coll_rank itself where that is the emulation's, as in the GPU bundle's sim
# flavour): a run on the CPU, labelled cudasim, which says nothing about NCCL's own transports.
# TRAIN_CUDA_FLAVOUR=cuda (make test-gpu: real devices only) leaves cudasim out.
# timeout: 300
set -euo pipefail

# shellcheck source=prologue.sh
. "$(dirname "$0")/prologue.sh"
fail_show=(gpurun.out gpurun.err)
need_built gpurun rendezvousd tests/coll_rank

# devices BIN: sets nccl, ndev and devname from BIN's "devices" line.
devices() {
    local line
    line=$("$1" devices) || fail "'$1 devices' failed"
    case $line in
    "nccl none: "*)
        nccl=none ndev=0 devname=-
        why=${line#nccl none: }
        ;;
    "nccl "*" devices "*" name "*)
        read -r _ nccl _ ndev _ devname <<<"$line"
        ;;
    *) fail "'$1 devices' printed '$line'" ;;
    esac
}

# The real build on a real device first; else the emulation's build.
bin=$build/tests/coll_rank
flavour=cuda
label=
why=
devices "$bin"
if [ "$nccl" = none ] || [ "$ndev" = 0 ] || [ "$devname" = cudasim ]; then
    reason=${why:-no CUDA device available}
    sim=${GPURUN_COLL_RANK_SIM:-$build/sim/tests/coll_rank}
    if [ "$devname" = cudasim ]; then
        # The build folder's own coll_rank is the emulation's (the GPU bundle's sim flavour).
        reason="'$bin' is a cudasim build"
        sim=$bin
    fi
    [ "${TRAIN_CUDA_FLAVOUR:-}" != cuda ] || skip "$reason (real devices only: no cudasim)"
    [[ $sim == /* ]] || sim=$root/$sim
    [ -x "$sim" ] || skip "$reason (and no cudasim build of coll_rank at '$sim')"
    bin=$sim
    # Four emulated devices, so that each of three ranks has its own, as on a real machine
    # (the agent gives rank i device i through CUDA_VISIBLE_DEVICES).
    export CUDASIM_DEVICES=4
    devices "$bin"
    [ "$nccl" != none ] || skip "the cudasim build of coll_rank has no NCCL"
    [ "$devname" = cudasim ] || fail "'$bin' is not a cudasim build (device '$devname')"
    flavour=cudasim
    label="cudasim: "
fi
echo "# flavour: $flavour ($bin: NCCL $nccl, $ndev device(s), $devname)"

# fits WORLD: whether WORLD ranks can run, one GPU each.
skipped=()
fits() {
    [ "$ndev" -ge "$1" ] && return 0
    skipped+=("$1 ranks: NCCL refuses two ranks on one GPU and this machine has $ndev")
    return 1
}

# job NAME NPROCS MODE LIMIT: one gpurun job of coll_rank MODE (in a job dir of its own);
# sets rc.
jobs=0
job() {
    local name=$1 nprocs=$2 mode=$3 limit=$4 t0
    rc=0
    jobs=$((jobs + 1))
    t0=$(date +%s%N)
    timeout -k 5 "$limit" "$build/gpurun" --local --gpus-per-node "$nprocs" \
        --job-dir "$work/$jobs-$name" -- "$bin" "$mode" \
        >"$work/gpurun.out" 2>"$work/gpurun.err" </dev/null || rc=$?
    echo "# ${label}${name}_job_ms=$((($(date +%s%N) - t0) / 1000000))"
    [ "$rc" != 124 ] || fail "$name: gpurun did not finish within $limit s"
}

# check WORLD: nccl-check with WORLD ranks; every rank passed, described its communicator,
# and the results hash the same everywhere (compared in the job through the store) and as in
# an earlier job of the same world size.
declare -A hashes
check() {
    local world=$1 r line hash what="ranks, rank"
    fits "$world" || return 0
    job "check$world" "$world" nccl-check 240
    [ "$rc" = 0 ] || fail "nccl-check with $world ranks: gpurun exited with status $rc"
    [ "$world" = 1 ] && what="rank on CUDA device"
    for ((r = 0; r < world; r++)); do
        line="rank $r/$world: all nccl checks passed"
        grep -qxF "[$r] $line" "$work/gpurun.out" || fail "$world ranks: output lacks '[$r] $line'"
        grep -qE "^\[$r\] rank $r/$world: nccl: (one|$world) $what" "$work/gpurun.out" ||
            fail "$world ranks: rank $r did not describe an nccl communicator"
    done
    hash=$(sed -n 's/^\[0\] hash \([0-9a-f]\{16\}\)$/\1/p' "$work/gpurun.out")
    [ -n "$hash" ] || fail "$world ranks: rank 0 printed no hash"
    if [ -n "${hashes[$world]:-}" ] && [ "${hashes[$world]}" != "$hash" ]; then
        fail "$world ranks: hash $hash, where an earlier job of $world ranks gave ${hashes[$world]}"
    fi
    hashes[$world]=$hash
    grep -F "[0] rank 0/$world: nccl" "$work/gpurun.out" | sed 's/^/# /'
    echo "# ${label}$world rank(s): device allreduce, reduce-scatter, all-gather," \
        "host operations ok (hash $hash)"
}

# fault MODE WORLD: every rank but the last reports the error it saw, the communicator
# aborted. The emulation's NCCL gives up on a quiet peer after CUDASIM_NCCL_TIMEOUT_MS (its
# calls block inside themselves, out of the backend's watch); real NCCL's wait is the
# backend's 2 s watch.
fault() {
    local mode=$1 world=$2 r
    fits "$world" || return 0
    CUDASIM_NCCL_TIMEOUT_MS=2000 job "$mode$world" "$world" "nccl-$mode" 60
    [ "$rc" = 0 ] || fail "nccl-$mode with $world ranks: gpurun exited with status $rc"
    for ((r = 0; r < world - 1; r++)); do
        grep -qE "^\[$r\] rank $r/$world: error seen: nccl .*: communicator aborted$" \
            "$work/gpurun.out" || fail "nccl-$mode with $world ranks: rank $r reported no error"
    done
    grep -E '^\[[0-9]+\] rank [0-9]+/[0-9]+: error seen' "$work/gpurun.out" | sed 's/^/# /'
}

check 1
check 2
check 3
check 3
fault die 2
fault die 3
fault stall 2
fault stall 3

# nojoin WORLD: the set-up fails on every rank but the last, naming the last.
nojoin() {
    local world=$1 r last=$(($1 - 1))
    fits "$world" || return 0
    CUDASIM_NCCL_TIMEOUT_MS=2000 job "nojoin$world" "$world" nccl-nojoin 60
    [ "$rc" = 0 ] || fail "nccl-nojoin with $world ranks: gpurun exited with status $rc"
    for ((r = 0; r < last; r++)); do
        grep -qE "^\[$r\] rank $r/$world: error seen: nccl: .*rank $last did not join" \
            "$work/gpurun.out" || fail "nccl-nojoin with $world ranks: rank $r did not name rank $last"
    done
    grep -E '^\[[0-9]+\] rank [0-9]+/[0-9]+: error seen' "$work/gpurun.out" | sed 's/^/# /'
}

if [ "$flavour" = cudasim ]; then
    nojoin 2
    nojoin 3
fi

if [ ${#skipped[@]} -gt 0 ]; then
    printf '# %s\n' "${skipped[@]}"
    skip "${skipped[0]}"
fi
