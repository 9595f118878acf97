#!/usr/bin/env bash
# Pre-flight checks, with three rendezvousd on loopback and job.json written by hand (each
# daemon's own CUDA_VISIBLE_DEVICES stands for its node's GPUs, as Slurm gives a step): a
# node that shows 1 of the 2 GPUs the job asks is fenced before any rank starts and the
# spare takes its place; without a spare the job ends with exit 125, no rank started, the
# cause naming the node and the figure; --preflight=off runs it anyway; a job dir without
# the free space asked fails every node. With the fake NVML (tests/helpers/fake_nvml.c): a
# GPU without --min-gpu-free's share of its memory free ends the job with 125 before any rank
# starts, naming the GPU and its figures, or its node gives its place to the spare; 0 turns
# the check off; CUDA_VISIBLE_DEVICES (indices or UUIDs) narrows the GPUs checked; fewer NVML
# GPUs than asked, and a lost one, are named; the host's own file wins over "default".
# timeout: 90
set -euo pipefail

# shellcheck source=prologue.sh
. "$(dirname "$0")/prologue.sh"
fail_show=('*.err' '*.out')
show_lines=30
need_built rendezvousd tests/fakenvml/libnvidia-ml.so.1
rdv=$build/rendezvousd
fake_lib=$build/tests/fakenvml
py=/usr/bin/python3
[ -x "$py" ] || py=python3

# run_job NAME NNODES SPARES EXTRA-JSON CVD...: a job dir, one daemon per CVD (node k gets
# CUDA_VISIBLE_DEVICES=CVD k, none for "-"; where nvml[k] is set, the fake NVML reading that
# directory); waits for all; sets st[k], the daemons' statuses.
nvml=()
run_job() {
    local name=$1 nnodes=$2 spares=$3 extra=$4 k=0 pids=()
    shift 4
    dir=$work/$name
    mkdir -m 0700 "$dir"
    head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$dir/key"
    echo >>"$dir/key"
    chmod 600 "$dir/key"
    cat >"$dir/job.json" <<JSON
{"version": 1, "job_id": "pre-$name", "nnodes": $nnodes, "spare_nodes": $spares, "nprocs": 1,
 "loopback": true, "gpus_per_node": 2, "kill_grace_ms": 500, "join_timeout_ms": 20000 $extra,
 "argv": ["sh", "-c", "echo \"rank \$RANK node_rank \$NODE_RANK\""]}
JSON
    for cvd in "$@"; do
        local envs=(-u CUDA_VISIBLE_DEVICES -u GPURUN_FAKE_NVML_DIR)
        [ "$cvd" = - ] || envs+=("CUDA_VISIBLE_DEVICES=$cvd")
        if [ -n "${nvml[k]:-}" ]; then
            envs+=("LD_LIBRARY_PATH=$fake_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
                "GPURUN_FAKE_NVML_DIR=${nvml[k]}")
        fi
        env "${envs[@]}" "$rdv" --job-dir "$dir" --node-rank "$k" \
            >"$work/$name-n$k.out" 2>"$work/$name-n$k.err" &
        pids+=($!)
        bg_pids+=($!)
        k=$((k + 1))
    done
    st=()
    for k in "${!pids[@]}"; do
        st[k]=0
        wait "${pids[k]}" || st[k]=$?
    done
    bg_pids=()
}

field() {
    "$py" -c 'import json, sys; d = json.load(open(sys.argv[1])); print(eval(sys.argv[2]))' \
        "$dir/summary.json" "$1"
}

# --- node 1 shows one GPU of two: the spare takes its place ---------------------------------
run_job swap 2 1 "" 0,1 0 0,1
[ "${st[0]}" = 0 ] || fail "node 0 exited ${st[0]}: $(tail -n 5 "$work/swap-n0.err")"
[ "$(field "d['outcome']")" = completed ] || fail "outcome $(field "d['outcome']")"
[ "$(field "[(s['node'], s['spare'], s['generation']) for s in d['swaps']]")" = "[(1, 2, 0)]" ] ||
    fail "swaps: $(field "d.get('swaps')")"
field "d['swaps'][0]['cause']" |
    grep -qxF "node 1 ('$(hostname)') failed pre-flight: 1 of 2 GPUs visible (CUDA_VISIBLE_DEVICES)" ||
    fail "the swap's cause: $(field "d['swaps'][0]['cause']")"
grep -qx "\[1\] rank 1 node_rank 1" "$work/swap-n2.out" ||
    fail "rank 1 did not run on the spare: $(cat "$work/swap-n2.out")"
if grep -q "^\[" "$work/swap-n1.out"; then
    fail "a rank ran on the node that failed pre-flight: $(cat "$work/swap-n1.out")"
fi
# Said once, by the leader, with what it did about it.
grep -qF "warn: node 1 ('$(hostname)') fenced: failed pre-flight: 1 of 2 GPUs visible (CUDA_VISIBLE_DEVICES); spare node 2" \
    "$work/swap-n0.err" || fail "the leader did not say why node 1 was fenced: $(cat "$work/swap-n0.err")"
[ "$(cat "$work"/swap-n*.err | grep -c 'failed pre-flight')" = 1 ] ||
    fail "node 1's failure not said once: $(cat "$work"/swap-n*.err | grep 'failed pre-flight')"
echo "# a node short of GPUs: fenced, the spare ran its rank"

# --- no spare: the job ends before any rank starts ------------------------------------------
run_job nospare 2 0 "" 0,1 0
[ "${st[0]}" = 125 ] || fail "without a spare node 0 exited ${st[0]}, want 125"
field "d['first_failure']['cause']" | grep -q "node 1 .* failed pre-flight: 1 of 2 GPUs visible" ||
    fail "cause: $(field "d['first_failure']['cause']")"
[ "$(field "d['first_failure']['class']")" = node ] || fail "class $(field "d['first_failure']")"
if cat "$work"/nospare-n*.out | grep -q "^\["; then
    fail "a rank started: $(cat "$work"/nospare-n*.out)"
fi
echo "# without a spare: exit 125 before any rank, the node and its figure named"

# --- --preflight=off: the same nodes run ---------------------------------------------------
run_job off 2 0 ', "preflight": 0' 0,1 0
[ "${st[0]}/${st[1]}" = 0/0 ] || fail "with pre-flight off: statuses ${st[0]}/${st[1]}"
echo "# --preflight=off: not checked"

# --- the job dir without the free space asked -----------------------------------------------
run_job full 1 0 ', "min_free_mb": 1073741824' 0,1
[ "${st[0]}" = 125 ] || fail "a job dir without the free space: node 0 exited ${st[0]}"
field "d['first_failure']['cause']" | grep -q "node 0 .* failed pre-flight: job dir '.*': [0-9]* MiB free, below 1073741824" ||
    fail "cause: $(field "d['first_failure']['cause']")"
echo "# a job dir short of space: named"

# --- the fake NVML: GPUs and their memory -------------------------------------------------
# fake_gpus NAME [--host HOST] LINE...: a fake NVML directory $work/nvml-NAME with LINEs
# ("TOTAL FREE [UUID]", MiB) in its file HOST (default: "default"); prints the directory.
fake_gpus() {
    local d=$work/nvml-$1 f=default
    shift
    if [ "${1:-}" = --host ]; then
        f=$2
        shift 2
    fi
    mkdir -p "$d"
    printf '%s\n' "$@" >"$d/$f"
    echo "$d"
}
good=$(fake_gpus good "81920 81000" "81920 80000" "81920 79000")
busy=$(fake_gpus busy "81920 81000" "81920 2048" "81920 79000")
one=$(fake_gpus one "81920 81000")
lost=$(fake_gpus lost "81920 lost" "81920 80000")

# no_rank NAME: fails when a rank of job NAME started (a rank's line in a daemon's output).
no_rank() {
    if cat "$work/$1"-n*.out | grep -q "^\["; then
        fail "$1: a rank started: $(cat "$work/$1"-n*.out)"
    fi
}

# A GPU held by another process: exit 125 before any rank, the GPU and its figures named.
nvml=("$busy")
run_job gpubusy 1 0 "" -
[ "${st[0]}" = 125 ] || fail "a busy GPU: node 0 exited ${st[0]}, want 125"
field "d['first_failure']['cause']" |
    grep -qxF "node 0 ('$(hostname)') failed pre-flight: GPU 1 (NVML): 2048 of 81920 MiB free, below 90%" ||
    fail "cause: $(field "d['first_failure']['cause']")"
no_rank gpubusy
grep -qF "error: job failed: node 0 ('$(hostname)') failed pre-flight: GPU 1 (NVML): 2048 of 81920 MiB free, below 90%" \
    "$work/gpubusy-n0.err" || fail "node 0 did not say why: $(cat "$work/gpubusy-n0.err")"
[ "$(grep -c 'failed pre-flight' "$work/gpubusy-n0.err")" = 1 ] ||
    fail "node 0's failure not said once: $(grep 'failed pre-flight' "$work/gpubusy-n0.err")"
echo "# a GPU without the free memory asked: exit 125 before any rank, GPU and figures named"

# The threshold is the job's: 2048 of 81920 MiB is 2.5%.
run_job gpubusy2 1 0 ', "min_gpu_free_pct": 3' -
[ "${st[0]}" = 125 ] || fail "min_gpu_free_pct 3: node 0 exited ${st[0]}, want 125"
field "d['first_failure']['cause']" | grep -qF "GPU 1 (NVML): 2048 of 81920 MiB free, below 3%" ||
    fail "cause: $(field "d['first_failure']['cause']")"
run_job gpubusy3 1 0 ', "min_gpu_free_pct": 2' -
[ "${st[0]}" = 0 ] || fail "min_gpu_free_pct 2: node 0 exited ${st[0]}: $(tail -n 3 "$work/gpubusy3-n0.err")"

# --min-gpu-free 0: not checked, the rank runs.
run_job gpuoff 1 0 ', "min_gpu_free_pct": 0' -
[ "${st[0]}" = 0 ] || fail "min_gpu_free_pct 0: node 0 exited ${st[0]}: $(tail -n 3 "$work/gpuoff-n0.err")"
grep -qx "\[0\] rank 0 node_rank 0" "$work/gpuoff-n0.out" ||
    fail "min_gpu_free_pct 0: rank 0 did not run: $(cat "$work/gpuoff-n0.out")"
echo "# the threshold is the job's; 0 turns the check off"

# CUDA_VISIBLE_DEVICES narrows the GPUs checked: indices, and UUIDs (whole or a prefix).
run_job cvdidx 1 0 "" 0,2
[ "${st[0]}" = 0 ] || fail "GPUs 0,2 of a node whose GPU 1 is busy: exit ${st[0]}: $(tail -n 3 "$work/cvdidx-n0.err")"
run_job cvduuid 1 0 "" GPU-00000000-0000-0000-0000-000000000002,GPU-00000000-0000-0000-0000-00000000000
[ "${st[0]}" = 0 ] || fail "GPUs 2,0 by UUID: exit ${st[0]}: $(tail -n 3 "$work/cvduuid-n0.err")"
run_job cvdbusy 1 0 "" 0,GPU-00000000-0000-0000-0000-000000000001
[ "${st[0]}" = 125 ] || fail "GPU 1 by UUID: exit ${st[0]}, want 125"
field "d['first_failure']['cause']" | grep -qF "GPU 1 (NVML): 2048 of 81920 MiB free, below 90%" ||
    fail "cause: $(field "d['first_failure']['cause']")"
echo "# CUDA_VISIBLE_DEVICES narrows the GPUs checked, by index or UUID"

# Fewer GPUs than asked, counted by NVML; a GPU whose memory NVML cannot read.
nvml=("$one")
run_job nvmlone 1 0 "" -
[ "${st[0]}" = 125 ] || fail "1 NVML GPU of 2: exit ${st[0]}, want 125"
field "d['first_failure']['cause']" | grep -qF "failed pre-flight: 1 of 2 GPUs visible (NVML)" ||
    fail "cause: $(field "d['first_failure']['cause']")"
no_rank nvmlone
nvml=("$lost")
run_job nvmllost 1 0 "" -
[ "${st[0]}" = 125 ] || fail "a lost GPU: exit ${st[0]}, want 125"
field "d['first_failure']['cause']" | grep -qF "failed pre-flight: GPU 0 (NVML): memory not readable: GPU is lost" ||
    fail "cause: $(field "d['first_failure']['cause']")"
echo "# fewer NVML GPUs than asked, and a lost GPU, are named"

# The host's own file wins over "default" (what tells the Slurm test cluster's nodes apart).
mine=$(fake_gpus mine "81920 1024" "81920 1024")
fake_gpus mine --host "$(hostname)" "81920 81920" "81920 81920" >/dev/null
nvml=("$mine")
run_job hostfile 1 0 "" -
[ "${st[0]}" = 0 ] || fail "the host's file: exit ${st[0]}: $(tail -n 3 "$work/hostfile-n0.err")"
echo "# the host's own file wins over the default one"

# A node whose GPU is busy gives its place to the spare.
nvml=("$good" "$busy" "$good")
run_job gpuswap 2 1 "" - - -
[ "${st[0]}" = 0 ] || fail "node 0 exited ${st[0]}: $(tail -n 5 "$work/gpuswap-n0.err")"
[ "$(field "[(s['node'], s['spare'], s['generation']) for s in d['swaps']]")" = "[(1, 2, 0)]" ] ||
    fail "swaps: $(field "d.get('swaps')")"
field "d['swaps'][0]['cause']" |
    grep -qxF "node 1 ('$(hostname)') failed pre-flight: GPU 1 (NVML): 2048 of 81920 MiB free, below 90%" ||
    fail "the swap's cause: $(field "d['swaps'][0]['cause']")"
grep -qx "\[1\] rank 1 node_rank 1" "$work/gpuswap-n2.out" ||
    fail "rank 1 did not run on the spare: $(cat "$work/gpuswap-n2.out")"
if grep -q "^\[" "$work/gpuswap-n1.out"; then
    fail "a rank ran on the node with the busy GPU: $(cat "$work/gpuswap-n1.out")"
fi
echo "# a node with a busy GPU: fenced, the spare ran its rank"
