# Shared by tests/integ/horovod_*.sh (sourced, not run, after the prologue: prologue.sh, or
# tests/netns.sh's netns_test_begin): horovod's own Python client code, fetched at test time
# from PyPI's horovod 0.28.1 source release, never kept in this tree.
# shellcheck shell=bash

# The horovod release whose client and launcher code the tests hold gpurun to.
HVD_VERSION=0.28.1
# Files of the release the checker (tests/ranks/horovod_rendezvous.py) uses: the HTTP client and the
# codec it imports, horovodrun's host assignment, and gloo_run.py, read for two functions.
HVD_FILES=(horovod/runner/http/http_client.py horovod/runner/common/util/codec.py
    horovod/runner/common/util/hosts.py horovod/runner/gloo_run.py)

# hvd_fetch PYTHON DIR: downloads horovod's source release (and cloudpickle, which its codec
# imports) with PYTHON's pip into DIR/dl and lays out DIR/py/horovod/..., a package of
# HVD_FILES alone (empty __init__.py files: horovod's own import all of horovod). Sets
# HVD_PYTHONPATH and HVD_GLOO_RUN. Exits 77 with the reason when PyPI cannot be reached.
hvd_fetch() {
    local python=$1 dir=$2 f d log
    log=$dir/pip.log
    mkdir -p "$dir/dl" "$dir/py"
    "$python" -m pip --version >/dev/null 2>&1 ||
        skip "'$python' has no pip to fetch horovod $HVD_VERSION"
    if ! timeout 180 "$python" -m pip download --disable-pip-version-check --no-deps \
        --no-binary :all: -d "$dir/dl" "horovod==$HVD_VERSION" >"$log" 2>&1 ||
        ! timeout 120 "$python" -m pip download --disable-pip-version-check --no-deps \
            --only-binary :all: -d "$dir/dl" cloudpickle >>"$log" 2>&1; then
        echo "# pip download failed:"
        tail -n 5 "$log" | sed 's/^/#   /'
        skip "cannot fetch horovod $HVD_VERSION or cloudpickle from PyPI: $(grep -m1 -E 'ERROR|Error' "$log" || tail -n 1 "$log")"
    fi
    for f in "${HVD_FILES[@]}"; do
        tar -xzf "$dir/dl/horovod-$HVD_VERSION.tar.gz" -C "$dir/py" --strip-components=1 \
            "horovod-$HVD_VERSION/$f" || fail "horovod-$HVD_VERSION.tar.gz has no '$f'"
        d=$(dirname "$f")
        while [ "$d" != . ]; do
            touch "$dir/py/$d/__init__.py"
            d=$(dirname "$d")
        done
    done
    # shellcheck disable=SC2034 # read by the sourcing script
    HVD_PYTHONPATH=$dir/py:$(echo "$dir"/dl/cloudpickle-*.whl)
    # shellcheck disable=SC2034 # read by the sourcing script
    HVD_GLOO_RUN=$dir/py/horovod/runner/gloo_run.py
}

# hvd_build PYTHON: horovod $HVD_VERSION for PyTorch with its gloo controller, built from
# PyPI's source release against PYTHON's torch into HVD_TARGET (GPURUN_HOROVOD_DIR, by default
# the build dir's python-deps/horovod) once, under 2 minutes on two cores, and kept there.
# Skips, saying why, with GPURUN_TEST_HOROVOD=0, without the build's tools or headers
# (cmake, g++, libtorch-dev, pybind11-dev: scripts/deps.sh) or where PyPI cannot be reached.
# Scripts of both lanes call it: the first builds, holding HVD_TARGET.lock, and a second
# waits for it. HOROVOD_DEBUG=1 builds at -O0, 40% sooner (about 100 s against 140 s on two
# cores), which a test's few steps never feel.
# shellcheck disable=SC2154 # work and build: the prologue's
hvd_build() {
    local lock
    HVD_TARGET=${GPURUN_HOROVOD_DIR:-$build/python-deps/horovod}
    mkdir -p "$(dirname "$HVD_TARGET")"
    exec {lock}>"$HVD_TARGET.lock"
    flock "$lock"
    hvd_build_locked "$1"
    exec {lock}>&-
}

# shellcheck disable=SC2154 # work: the prologue's
hvd_build_locked() {
    local python=$1 inc tool t0 rc=0
    (cd "$work" && PYTHONPATH=$HVD_TARGET "$python" -c 'import horovod.torch' >/dev/null 2>&1) &&
        return 0
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
    mkdir -p "$HVD_TARGET"
    echo "# building horovod $HVD_VERSION into $HVD_TARGET (log: $work/build.log)"
    t0=$(date +%s)
    # The build's own limit: horovod's C++ and its copy of gloo.
    HOROVOD_DEBUG=1 HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
        HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 MAKEFLAGS=-j$(nproc) timeout 1500 \
        "$python" -m pip install --disable-pip-version-check --no-build-isolation --upgrade \
        --target "$HVD_TARGET" "horovod==$HVD_VERSION" >"$work/build.log" 2>&1 || rc=$?
    echo "# horovod_build_s=$(($(date +%s) - t0))"
    if [ "$rc" != 0 ]; then
        # A half-made install must not pass for one next time.
        rm -rf "$HVD_TARGET"
        if grep -qE 'Failed to establish a new connection|Could not find a version|Temporary failure in name resolution' "$work/build.log"; then
            skip "cannot fetch horovod $HVD_VERSION from PyPI: $(grep -m1 -E 'ERROR|Error' "$work/build.log")"
        fi
        grep -E 'error:|Error [0-9]|fatal' "$work/build.log" | head -n 10 | sed 's/^/# /'
        fail "building horovod $HVD_VERSION failed (status $rc); see $work/build.log"
    fi
    (cd "$work" && PYTHONPATH=$HVD_TARGET "$python" -c 'import horovod.torch' >/dev/null 2>&1) ||
        fail "horovod $HVD_VERSION built but 'import horovod.torch' fails"
}
