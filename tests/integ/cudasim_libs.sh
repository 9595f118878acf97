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

# shellcheck source=prologue.sh
. "$(dirname "$0")/prologue.sh"
bin=$build/sim/libs_test

# Built by `make sim` wherever the CUDA toolkit's headers are (the Makefile finds them).
need_built --hint "make sim; it needs the CUDA toolkit's headers" sim/libs_test
if [ ! -d /dev/shm ] || [ ! -w /dev/shm ]; then
    skip "no writable /dev/shm for the emulated NCCL"
fi

rc=0
# The refusals print what they refused on stderr: kept with the rest for a failure's report.
(cd "$work" && "$bin") >"$work/out" 2>&1 || rc=$?
if [ "$rc" != 0 ]; then
    show_lines=120
    fail "'$bin' exited $rc"
fi
grep -E '^(ok|not ok|#)' "$work/out" | sed 's/^\(ok\|not ok\)/# \1/'
echo "# cudasim: cuBLASLt and NCCL emulations agree with their documented semantics"
