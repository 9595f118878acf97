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
# The build's own limit (horovod's C++ and its copy of gloo).
BUILD_LIMIT_S=1500

need_built gpurun rendezvousd
[ -x "$python" ] || skip "no '$python'"
"$python" -c 'import importlib.util as u; assert u.find_spec("torch")' >/dev/null 2>&1 ||
    skip "'$python' has no torch (Debian's python3-torch)"

target=${GPURUN_HOROVOD_DIR:-$build/python-deps/horovod}
importable() {
    (cd "$work" && PYTHONPATH=$target "$python" -c 'import horovod.torch' >/dev/null 2>&1)
}
if ! importable; then
    [ "${GPURUN_TEST_HOROVOD:-1}" = 1 ] ||
        skip "GPURUN_TEST_HOROVOD=${GPURUN_TEST_HOROVOD}: horovod not built"
    for tool in cmake g++; do
        command -v "$tool" >/dev/null || skip "no $tool to build horovod"
    done
    inc=$("$python" -c 'import torch.utils.cpp_extension as c; print(c.include_paths()[0])' 2>/dev/null) ||
        skip "'$python' has no torch.utils.cpp_extension"
    [ -f "$inc/torch/extension.h" ] || skip "no torch C++ headers ('$inc/torch/extension.h'): apt-get install libtorch-dev"
    [ -f /usr/include/pybind11/pybind11.h ] || "$python" -c 'import pybind11' 2>/dev/null ||
        skip "no pybind11 headers: apt-get install pybind11-dev"
    mkdir -p "$target"
    echo "# building horovod $HVD_VERSION into $target (log: $work/build.log)"
    t0=$(date +%s)
    rc=0
    HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 HOROVOD_WITHOUT_TENSORFLOW=1 \
        HOROVOD_WITHOUT_MXNET=1 MAKEFLAGS=-j$(nproc) timeout "$BUILD_LIMIT_S" \
        "$python" -m pip install --disable-pip-version-check --no-build-isolation --upgrade \
        --target "$target" "horovod==$HVD_VERSION" >"$work/build.log" 2>&1 || rc=$?
    echo "# horovod_build_s=$(($(date +%s) - t0))"
    if [ "$rc" != 0 ]; then
        # A half-made install must not pass for one next time.
        rm -rf "$target"
        if grep -qE 'Failed to establish a new connection|Could not find a version|Temporary failure in name resolution' "$work/build.log"; then
            skip "cannot fetch horovod $HVD_VERSION from PyPI: $(grep -m1 -E 'ERROR|Error' "$work/build.log")"
        fi
        grep -E 'error:|Error [0-9]|fatal' "$work/build.log" | head -n 10 | sed 's/^/# /'
        fail "building horovod $HVD_VERSION failed (status $rc); see $work/build.log"
    fi
    importable || fail "horovod $HVD_VERSION built but 'import horovod.torch' fails"
fi
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
