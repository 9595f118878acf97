#!/bin/bash
# Real horovod under gpurun, no horovodrun: horovod 0.28.1 for PyTorch with its gloo controller,
# built from PyPI's source release against Debian's torch, runs tests/ranks/horovod_torch.py
# (hvd.init(), allreduce, allgather, broadcast, shutdown, and all of it again) under
# `gpurun --local --gpus-per-node 2` and `--local --nodes 2 --gpus-per-node 2`.
#
# Horovod is built once (about 2 minutes on two cores, with Debian's libtorch-dev and
# pybind11-dev from scripts/deps.sh) into GPURUN_HOROVOD_DIR, by default the build dir's
# python-deps/horovod, and kept there for the next run. GPURUN_TEST_HOROVOD=0 skips the test;
# so does a PyPI that cannot be reached, saying so.
# timeout: 1800
set -euo pipefail

# shellcheck source=prologue.sh
. "$(dirname "$0")/prologue.sh"
fail_show=(gpurun.out gpurun.err)
# shellcheck source=horovod_common.sh
. "$(dirname "$0")/horovod_common.sh"
python=${TORCH_PYTHON:-/usr/bin/python3}
NPROCS=2

need_built gpurun rendezvousd
[ -x "$python" ] || skip "no '$python'"
"$python" -c 'import importlib.util as u; assert u.find_spec("torch")' >/dev/null 2>&1 ||
    skip "'$python' has no torch (Debian's python3-torch)"

hvd_build "$python"
target=$HVD_TARGET
export PYTHONPATH=$target${PYTHONPATH:+:$PYTHONPATH}
unset HOROVOD_CONTROLLER HOROVOD_CPU_OPERATIONS HOROVOD_GLOO_IFACE

for nodes in 1 2; do
    world=$((nodes * NPROCS))
    rc=0
    t0=$(date +%s%N)
    timeout -k 5 240 "$build/gpurun" --local --nodes "$nodes" --gpus-per-node "$NPROCS" \
        --job-dir "$work/job-$nodes" -- "$python" "$root/tests/ranks/horovod_torch.py" \
        >"$work/gpurun.out" 2>"$work/gpurun.err" || rc=$?
    echo "# horovod_torch_nodes${nodes}_ms=$((($(date +%s%N) - t0) / 1000000))"
    [ "$rc" != 124 ] || fail "gpurun ($nodes nodes) did not finish within 240 s"
    [ "$rc" = 0 ] || fail "gpurun ($nodes nodes) exited with status $rc, not 0"
    for ((r = 0; r < world; r++)); do
        line="horovod torch rank $r/$world: init, allreduce, allgather, broadcast ok, twice"
        grep -qxF "[$r] $line" "$work/gpurun.out" || fail "gpurun's output lacks '[$r] $line'"
    done
    echo "# $world horovod ranks on $nodes node(s): hvd.init, collectives, shutdown and init again ok"
done
