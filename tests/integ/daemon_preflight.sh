#!/usr/bin/env bash
# Pre-flight checks, with three rendezvousd on loopback and job.json written by hand (each
# daemon's own CUDA_VISIBLE_DEVICES stands for its node's GPUs, as Slurm gives a step): a
# node that shows 1 of the 2 GPUs the job asks is fenced before any rank starts and the
# spare takes its place; without a spare the job ends with exit 125, no rank started, the
# cause naming the node and the figure; --preflight=off runs it anyway; a job dir without
# the free space asked fails every node.
# timeout: 60
set -euo pipefail

# shellcheck source=prologue.sh
. "$(dirname "$0")/prologue.sh"
fail_show=('*.err' '*.out')
show_lines=30
need_built rendezvousd
rdv=$build/rendezvousd
py=/usr/bin/python3
[ -x "$py" ] || py=python3

# run_job NAME NNODES SPARES EXTRA-JSON CVD...: a job dir, one daemon per CVD (node k gets
# CUDA_VISIBLE_DEVICES=CVD k); waits for all; sets st[k], the daemons' statuses.
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
        CUDA_VISIBLE_DEVICES=$cvd "$rdv" --job-dir "$dir" --node-rank "$k" \
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
grep -q "node 1 failed pre-flight: 1 of 2 GPUs visible" "$work/swap-n1.err" ||
    fail "node 1 did not say why: $(cat "$work/swap-n1.err")"
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
