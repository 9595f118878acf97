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
