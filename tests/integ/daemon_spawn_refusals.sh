#!/usr/bin/env bash
# What the daemon refuses or explains when it starts a rank, where gpurun checked nothing (a
# Slurm node, a daemon started by hand): one rendezvousd with job.json
#  - --gpu-bind single (gpu_bind 1) for 2 ranks where CUDA_VISIBLE_DEVICES lists 1 GPU: the
#    rank past the list is refused (exit 125, the counts named), not run without a GPU;
#  - a script whose "#!" interpreter does not exist: exit 127 and "its interpreter ... does not
#    exist" on the rank's stderr, not the script's own absence.
# timeout: 60
set -euo pipefail

# shellcheck source=prologue.sh
. "$(dirname "$0")/prologue.sh"
fail_show=('*.err' '*.out')
need_built --hint "make all" rendezvousd
rdv=$build/rendezvousd

# job NAME JSON-FIELDS: a job dir for one node's ranks; prints its path.
job() {
    local dir=$work/$1
    mkdir -m 0700 "$dir"
    head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$dir/key"
    echo >>"$dir/key"
    chmod 600 "$dir/key"
    printf '{"version": 1, "job_id": "%s", "nnodes": 1, "loopback": true, %s}\n' "$1" "$2" \
        >"$dir/job.json"
    echo "$dir"
}

# run_node DIR NAME [ENV...]: node 0 of DIR's job, to the end; rc its exit status.
run_node() {
    local dir=$1 name=$2
    shift 2
    rc=0
    env "$@" timeout -k 5 40 "$rdv" --job-dir "$dir" --node-rank 0 >"$work/$name.out" \
        2>"$work/$name.err" </dev/null || rc=$?
}

# shellcheck disable=SC2016 # expanded by each rank
dir=$(job bind '"nprocs": 2, "gpu_bind": 1, "argv": ["sh", "-c", "echo gpus=$CUDA_VISIBLE_DEVICES"]')
run_node "$dir" bind CUDA_VISIBLE_DEVICES=7
[ "$rc" = 125 ] || fail "--gpu-bind single with too few GPUs: exit $rc, want 125"
grep -qF -- "--gpu-bind single: local rank 1 of 2 gets no GPU: CUDA_VISIBLE_DEVICES lists fewer ('7')" \
    "$work/bind.err" || fail "no refusal naming the counts: $(tail -n 5 "$work/bind.err")"
! grep -q 'gpus=$' "$work/bind.out" || fail "a rank ran with no GPU: $(cat "$work/bind.out")"
echo "# --gpu-bind single, 2 ranks, 1 GPU: the second rank refused, exit 125"
# shellcheck disable=SC2016 # expanded by each rank
dir=$(job bind2 '"nprocs": 2, "gpu_bind": 1, "argv": ["sh", "-c", "echo gpus=$CUDA_VISIBLE_DEVICES"]')
run_node "$dir" bind2 CUDA_VISIBLE_DEVICES=7,9
[ "$rc" = 0 ] || fail "--gpu-bind single with enough GPUs: exit $rc"
grep -qxF '[1] gpus=9' "$work/bind2.out" || fail "rank 1 did not get the second GPU: $(cat "$work/bind2.out")"

# A relative interpreter: gpurun's own check (absolute paths only) lets it through.
printf '#!no-such-interpreter\necho never\n' >"$work/script.sh"
chmod +x "$work/script.sh"
dir=$(job interp "\"nprocs\": 1, \"workdir\": \"$work\", \"argv\": [\"./script.sh\"]")
run_node "$dir" interp
[ "$rc" = 127 ] || fail "a missing #! interpreter: exit $rc, want 127"
grep -qF "cannot execute './script.sh': its interpreter 'no-such-interpreter' (from its #! line) does not exist" \
    "$work/interp.out" "$work/interp.err" ||
    fail "the interpreter is not named: $(tail -n 5 "$work/interp.out" "$work/interp.err")"
echo "# a missing #! interpreter: named, exit 127"
