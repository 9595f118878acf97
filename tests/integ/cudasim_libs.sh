#!/bin/bash
# cudasim's cuBLASLt and NCCL (tests/cudasim/cublaslt.cc, nccl.cc) against their documented
# semantics: $BUILD/sim/libs_test checks products of every transpose, type and epilogue
# against plain loops (with known answers for the orientation of bias, aux and the bias
# gradients, and matmul.cu's own row-major calls), the refusals that send matmul.cu to its
# fallback, and NCCL with one process and with three: every collective in and out of place,
# bf16 sums rounded once, a peer killed mid-collective (an error within a second), a timeout,
# mismatched calls, no segment left in /dev/shm. Plain host code: no GPU involved or needed.
# timeout: 120
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
build=${BUILD:-build}
[[ $build == /* ]] || build=$root/$build
bin=$build/sim/libs_test

skip() {
    echo "# SKIP $*"
    exit 77
}

# Built by `make sim` wherever the CUDA toolkit's headers are (the Makefile finds them).
[ -x "$bin" ] || skip "'$bin' is not built (make sim; it needs the CUDA toolkit's headers)"
if [ ! -d /dev/shm ] || [ ! -w /dev/shm ]; then
    skip "no writable /dev/shm for the emulated NCCL"
fi

out=$(mktemp "${TEST_TMPDIR:-${TMPDIR:-/tmp}}/cudasim-libs.XXXXXX")
trap 'rm -f "$out"' EXIT
rc=0
# The refusals print what they refused on stderr: kept with the rest for a failure's report.
(cd "${TEST_TMPDIR:-${TMPDIR:-/tmp}}" && "$bin") >"$out" 2>&1 || rc=$?
if [ "$rc" != 0 ]; then
    echo "FAIL: '$bin' exited $rc"
    sed 's/^/# /' "$out" | tail -n 120
    exit 1
fi
grep -E '^(ok|not ok|#)' "$out" | sed 's/^\(ok\|not ok\)/# \1/'
echo "# cudasim: cuBLASLt and NCCL emulations agree with their documented semantics"
