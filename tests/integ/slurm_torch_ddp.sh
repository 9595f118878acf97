#!/bin/bash
# A plain torch DDP script (gloo, env://) with the gpurun Python module on the Slurm test
# cluster, across two nodes that are network namespaces of their own: gpurun status shows all
# 4 ranks' steps while it runs and it completes with 0; then the same script asks for the
# pre-timeout signal (gpurun.on_preempt), the signal is sent to the batch shell as Slurm's
# --signal=B:USR1 does, and every rank saves its checkpoint in the job dir and exits 0.
# Uses Debian's python3-torch (/usr/bin/python3); skips without it.
# timeout: 240
# lane: side
set -euo pipefail

python=${TORCH_PYTHON:-/usr/bin/python3}
if ! "$python" -c 'import importlib.util as u; assert u.find_spec("torch")' >/dev/null 2>&1; then
    echo "# SKIP '$python' has no torch (Debian's python3-torch)"
    exit 77
fi
script=$(cd "$(dirname "$0")/../.." && pwd)/tests/ranks/torch_ddp.py
# shellcheck source=slurm_client_common.sh
. "$(dirname "$0")/slurm_client_common.sh"

# ddp_job NAME ARGS...: submits the DDP script on 2 nodes x 2 ranks with --wait, in the
# background (its pid in $ddp_pid), and waits until gpurun status shows every rank past
# step 3 (the job's id in $id).
ddp_job() {
    local name=$1 i
    shift
    "$gpurun" --wait -N 2 --gpus-per-node 2 --kill-grace 2 -- "$python" "$script" "$@" \
        >"$name.out" 2>"$name.err" </dev/null &
    ddp_pid=$!
    id=
    for ((i = 0; i < 600; i++)); do
        [ -n "$id" ] || id=$(job_id "$name.out")
        if [ -n "$id" ] && "$gpurun" status "$id" --json >st.json 2>/dev/null &&
            [ "$(json st.json '(v.get("progress") or {}).get("step_min", 0) >= 3')" = True ]; then
            return 0
        fi
        kill -0 "$ddp_pid" 2>/dev/null || grs_fail "$name: gpurun ended early: $(tail -n 5 "$name.err" "$name.out")"
        sleep 0.2
    done
    grs_fail "$name: status never showed every rank past step 3: $(head -c 600 st.json)"
}

ddp_job run --steps 40 --step-ms 100
for r in 0 1 2 3; do
    [ "$(json st.json "v['live']['ranks'][$r]['step'] >= 3 and v['live']['ranks'][$r]['loss'] > 0")" = True ] ||
        grs_fail "rank $r's live status: $(json st.json "v['live']['ranks'][$r]")"
done
hosts=$(json st.json 'sorted(set(n["hostname"] for n in v["live"]["nodes"]))')
[ "$hosts" = "['node1', 'node2']" ] || grs_fail "the job's nodes: $hosts"
rc=0
wait "$ddp_pid" || rc=$?
[ "$rc" = 0 ] || grs_fail "the DDP job exited $rc: $(tail -n 5 run.err run.out)"
[ "$(grep -c '^\[[0-3]\] rank [0-3] done$' run.out)" = 4 ] ||
    grs_fail "not every rank finished: $(grep -v '^\[[0-3]\] rank [0-3] done$' run.out | tail -n 8)"
echo "# torch DDP over 2 Slurm nodes (namespaces): status showed 4 ranks' steps, exit 0"

# The pre-timeout signal, as Slurm sends it (--signal=B:USR1@...): only to the batch shell.
ddp_job preempt --steps 100000 --step-ms 50 --preempt
scancel --batch --signal=USR1 "$id"
rc=0
wait "$ddp_pid" || rc=$?
[ "$rc" = 0 ] || grs_fail "the prepared DDP job exited $rc after the signal: $(tail -n 5 preempt.err preempt.out)"
[ "$(grep -c '^\[[0-3]\] rank [0-3]: checkpoint at step [0-9]*$' preempt.out)" = 4 ] ||
    grs_fail "not every rank saved a checkpoint: $(tail -n 8 preempt.out)"
for r in 0 1 2 3; do
    [ -s "$GPURUN_JOBS/$id/ckpt-$r.pt" ] || grs_fail "no checkpoint of rank $r in the job dir"
done
run st.json st.err status "$id" --json
[ "$(json st.json 'v["state"], v["exit_status"]')" = "('COMPLETED', 0)" ] ||
    grs_fail "status after the checkpoint: $(json st.json 'v["state"], v["exit_status"]')"
echo "# the pre-timeout signal reached every rank of the prepared DDP job: 4 checkpoints, exit 0"
