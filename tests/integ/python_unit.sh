#!/usr/bin/env bash
# The gpurun Python module's unit tests (tests/python, unittest) against a fake agent: the
# wire, the agent's errors, report()'s checks and its never blocking, threads, fork, the
# pre-timeout signal, finalize, the no-op outside a job; and the Lightning and Hugging Face
# callbacks against stand-ins for the frameworks' classes; gpurun.inprocess's error classes
# where torch is there. Run by Debian's /usr/bin/python3
# (or $GPURUN_PYTHON), and again by a python3.8 where one runs: the oldest Python the package
# supports.
# timeout: 120
set -euo pipefail

# shellcheck source=prologue.sh
. "$(dirname "$0")/prologue.sh"
python=${GPURUN_PYTHON:-/usr/bin/python3}

[ -x "$python" ] || skip "no '$python'"

# run PYTHON: the whole suite under PYTHON, on the sources as they are, with
# no bytecode left behind in the tree.
run() {
    local py=$1 rc=0 t0 mods=(test_gpurun test_callbacks)
    t0=$(date +%s%N)
    # gpurun.inprocess's own tests where this Python has torch.
    if "$py" -c 'import torch' >/dev/null 2>&1; then
        mods+=(test_inprocess)
    fi
    (cd "$root/tests/python" &&
        PYTHONDONTWRITEBYTECODE=1 PYTHONPATH="$root/lib/rank/python" \
            "$py" -m unittest -v "${mods[@]}") >"$work/out" 2>&1 || rc=$?
    if [ "$rc" != 0 ]; then
        show_lines=120
        fail "the unit tests under $py exited with $rc"
    fi
    echo "# $("$py" -c 'import sys; print("python %d.%d" % sys.version_info[:2])'):" \
        "$(grep -E '^Ran [0-9]+ tests' "$work/out") in $((($(date +%s%N) - t0) / 1000000)) ms, OK"
}

run "$python"
if old=$(command -v python3.8) && "$old" -c 'import sys; assert sys.version_info[:2] == (3, 8)' \
    >/dev/null 2>&1; then
    run "$old"
fi
