#!/bin/bash
# Horovod without horovodrun: a `gpurun --local --nodes 2 --gpus-per-node 2` job whose ranks
# check every HOROVOD_* variable against what horovodrun's gloo_run sets for the same layout
# (-H node0:2,node1:2: two --local nodes share this machine's name, so gpurun names them
# node0 and node1) and use horovod's own HTTP client to exchange values through the leader's
# rendezvous and to walk its three scopes through DELETE (tests/ranks/horovod_rendezvous.py); then
# a job restarted once (--max-restarts 1) whose second generation must find the store empty.
# Horovod's code comes from PyPI at test time; skips when PyPI cannot be reached.
# timeout: 300
set -euo pipefail

# shellcheck source=prologue.sh
. "$(dirname "$0")/prologue.sh"
fail_show=(gpurun.out gpurun.err)
# shellcheck source=horovod_common.sh
. "$(dirname "$0")/horovod_common.sh"
python=${HOROVOD_TEST_PYTHON:-/usr/bin/python3}
NODES=2
NPROCS=2
WORLD=$((NODES * NPROCS))

need_built gpurun rendezvousd
[ -x "$python" ] || skip "no '$python'"

hvd_fetch "$python" "$work/horovod"
export PYTHONPATH=$HVD_PYTHONPATH${PYTHONPATH:+:$PYTHONPATH}
# The user's own settings would rightly win over gloo_run's defaults: none here.
unset HOROVOD_CONTROLLER HOROVOD_CPU_OPERATIONS HOROVOD_GLOO_IFACE

rc=0
t0=$(date +%s%N)
timeout -k 5 120 "$build/gpurun" --local --nodes "$NODES" --gpus-per-node "$NPROCS" \
    --job-dir "$work/job" -- "$python" "$root/tests/ranks/horovod_rendezvous.py" \
    --hosts "node0:$NPROCS,node1:$NPROCS" --addr 127.0.0.1 --iface lo \
    --gloo-run "$HVD_GLOO_RUN" >"$work/gpurun.out" 2>"$work/gpurun.err" || rc=$?
echo "# horovod_job_ms=$((($(date +%s%N) - t0) / 1000000))"
[ "$rc" != 124 ] || fail "gpurun did not finish within 120 s"
[ "$rc" = 0 ] || fail "gpurun exited with status $rc, not 0"
for ((r = 0; r < WORLD; r++)); do
    line="horovod rank $r/$WORLD: 12 HOROVOD_* variables as gloo_run's, kv ok, scopes ok"
    grep -qxF "[$r] $line" "$work/gpurun.out" || fail "gpurun's output lacks '[$r] $line'"
done
# Nothing the ranks sent was refused.
! grep -F 'horovod rendezvous' "$work/gpurun.err" | grep -v ' info: ' ||
    fail "the leader logged a refusal"
echo "# $WORLD ranks on $NODES --local nodes: HOROVOD_* as gloo_run's, horovod's client and scopes ok"

# A restart: generation 1 must find nothing generation 0 stored (tests/ranks/horovod_restart.py).
rc=0
timeout -k 5 120 "$build/gpurun" --local --nodes "$NODES" --gpus-per-node "$NPROCS" \
    --max-restarts 1 --restart-on all --job-dir "$work/job-restart" -- "$python" "$root/tests/ranks/horovod_restart.py" \
    >"$work/gpurun.out" 2>"$work/gpurun.err" || rc=$?
[ "$rc" = 0 ] || fail "the restart job exited with status $rc, not 0"
for ((r = 0; r < WORLD; r++)); do
    for line in "horovod rank $r gen 0: stored" "horovod rank $r gen 1: store empty"; do
        grep -qxF "[$r] $line" "$work/gpurun.out" || fail "gpurun's output lacks '[$r] $line'"
    done
done
echo "# restart: generation 1 found the horovod store empty"
