#!/usr/bin/env bash
# train.device = cuda where there is no GPU: gpurun-train stops at once with one line naming
# where device was set, "device 'cuda': no CUDA device available", and exit status 1, before
# it reads data or writes anything; the GPU benchmark prints one SKIP line and exits 0. Checked
# with the real build on a machine without a GPU, and with the cudasim build told that there
# is none (CUDASIM_DEVICES=0; not with TRAIN_CUDA_FLAVOUR=cuda), where the benchmark's smoke
# mode also runs for real. The cuda-only keys are refused on cpu.
# timeout: 240
set -euo pipefail
# shellcheck source=train_cuda_common.sh
. "$(dirname "$0")/train_cuda_common.sh"

cd "$work"
sed 's/^threads = 1/device = cuda/' small.cfg >cuda.cfg
line=$(grep -n '^device = cuda' cuda.cfg | cut -d: -f1)
checked=()
flavours=()

# expect_error BIN LINE ARGS...: BIN ARGS fails with exit 1 and LINE as its whole stderr, and
# has not created its out_dir.
expect_error() {
    local bin=$1 want=$2
    shift 2
    rc=0
    timeout -k 5 "$TRAIN_LIMIT" "$bin" "$@" train.out_dir="$work/never" >"$work/out" \
        2>"$work/err" </dev/null || rc=$?
    expect_rc 1 "$bin $*"
    [ "$(cat "$work/err")" = "gpurun-train: $want" ] ||
        fail "$bin $*: stderr is '$(cat "$work/err")', expected 'gpurun-train: $want'"
    [ ! -e "$work/never" ] || fail "$bin $*: out_dir was created before the device check"
}

# expect_skip BIN ARGS...: the benchmark BIN ARGS prints one SKIP line and exits 0.
expect_skip() {
    local out
    rc=0
    out=$("$@" 2>&1 </dev/null) || rc=$?
    expect_rc 0 "$*"
    [ "$out" = "SKIP train_gpu: no CUDA device available" ] ||
        fail "$*: printed '$out', expected 'SKIP train_gpu: no CUDA device available'"
}

expect_error "$train_bin" "command line: dtype 'bf16' needs device 'cuda' (the cpu backend computes in fp32)" \
    small.cfg train.dtype=bf16
expect_error "$train_bin" "command line: zero (1) needs device 'cuda' (ZeRO-1 shards the cuda backend's optimizer state)" \
    small.cfg train.zero=1

if built_with_cuda "$train_bin" && [ "$(gpu_count)" = 0 ]; then
    expect_error "$train_bin" "cuda.cfg:$line: device 'cuda': no CUDA device available" cuda.cfg
    expect_error "$train_bin" "command line: device 'cuda': no CUDA device available" \
        small.cfg train.device=cuda train.dtype=fp32 train.zero=1
    if [ -x "$build/bench/train_gpu" ]; then
        expect_skip "$build/bench/train_gpu"
    fi
    checked+=("the real build without a GPU")
    flavours+=(cuda)
fi

if [ "${TRAIN_CUDA_FLAVOUR:-}" != cuda ] && [ -n "${GPURUN_TRAIN_SIM:-}" ] &&
    [ -x "$GPURUN_TRAIN_SIM" ]; then
    export CUDASIM_DEVICES=0
    expect_error "$GPURUN_TRAIN_SIM" "cuda.cfg:$line: device 'cuda': no CUDA device available" \
        cuda.cfg
    sim_bench=$(dirname "$GPURUN_TRAIN_SIM")/bench/train_gpu
    if [ -x "$sim_bench" ]; then
        expect_skip "$sim_bench" --smoke
        unset CUDASIM_DEVICES
        rc=0
        "$sim_bench" --smoke >"$work/out" 2>"$work/err" </dev/null || rc=$?
        expect_rc 0 "$sim_bench --smoke"
        grep -q '^GPT-2 training step on cudasim: 2 layers' "$work/out" ||
            fail "the smoke benchmark did not describe its model and device"
        grep -Eq '^\| 2 \| 32 \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \| \*\*[0-9.]+%\*\* \| [0-9.]+ \|$' \
            "$work/out" || fail "the smoke benchmark printed no row for batch 2"
        echo "# ok (cudasim): the benchmark's smoke mode: $(grep '^| 2 |' "$work/out")"
    fi
    unset CUDASIM_DEVICES
    checked+=("cudasim with CUDASIM_DEVICES=0")
    flavours+=(cudasim)
fi

[ ${#checked[@]} -gt 0 ] ||
    skip "a GPU is present and there is no cudasim build: no 'no device' case to check here"
echo "# no-device line and exit status 1: ${checked[*]}"
echo "# flavour: $(IFS=,; echo "${flavours[*]}")"
