#!/usr/bin/env bash
# Checkpoints on cuda: a run resumed from its step-5 checkpoint writes the same metrics and
# the same step-10 checkpoint, bit for bit, as the run that went on (bf16, and fp32 with ZeRO-1
# on one rank); and the format is the cpu's: a cpu checkpoint resumes on cuda and a cuda one on
# cpu, each continuing the other's run within 1e-3 relative (fp32; a constant learning rate,
# so that the schedules of 5 and 10 steps agree). An llm.c checkpoint starts a cuda run as it
# starts a cpu one (within 1e-4). SIGTERM finishes the step, checkpoints and exits 0, and the
# resumed run matches an uninterrupted one bit for bit. Under cudasim, a run with the threads of
# each barrier phase in reverse order (CUDASIM_SCHEDULE) is bit-identical too: no races.
# timeout: 300
set -euo pipefail
# shellcheck source=train_cuda_common.sh
. "$(dirname "$0")/train_cuda_common.sh"
pick_flavour

small=(train.batch_size=2 train.eval_every=0 data.val=)

# resumed NAME ARGS...: 10 steps with a checkpoint every 5 in $work/NAME, then a copy of its
# step-5 checkpoint resumed to 10 in $work/NAME.r: the same metrics and step-10 state.
resumed() {
    local name=$1 a=$work/$1 b=$work/$1.r s
    shift
    train_cuda "$cfg" "${small[@]}" "$@" train.ckpt_every=5 train.out_dir="$a"
    expect_rc 0 "$name: 10 steps"
    for s in 5 10; do
        [ -f "$a/ckpt_0000000$s.bin" ] || [ -f "$a/ckpt_000000$s.bin" ] ||
            fail "$name: no checkpoint of step $s in '$a': $(ls "$a")"
    done
    mkdir "$b"
    cp "$a/ckpt_00000005.bin" "$a/metrics.jsonl" "$b/"
    train_cuda "$cfg" "${small[@]}" "$@" train.ckpt_every=5 train.out_dir="$b" train.resume=1
    expect_rc 0 "$name: resume from step 5"
    expect_out_line "resuming from '$b/ckpt_00000005.bin' at step 5"
    same_losses "$a/metrics.jsonl" "$b/metrics.jsonl" "$name: steps 6..10 after a resume"
    cmp -s <(state_of "$a/ckpt_00000010.bin") <(state_of "$b/ckpt_00000010.bin") ||
        fail "$name: the step-10 checkpoints' parameters and moments differ"
    ok "$name: the step-10 checkpoints are bit-identical"
}
resumed bf16
resumed "fp32-zero" train.dtype=fp32 train.zero=1

# Under cudasim, the whole step once more with each barrier phase's threads run in reverse
# order: a kernel whose result depends on the order has a race, and the metrics would differ.
if [ "$flavour" = cudasim ]; then
    CUDASIM_SCHEDULE=reverse train_cuda "$cfg" "${small[@]}" train.ckpt_every=5 \
        train.out_dir="$work/reverse"
    expect_rc 0 "bf16, 10 steps, CUDASIM_SCHEDULE=reverse"
    same_losses "$work/bf16/metrics.jsonl" "$work/reverse/metrics.jsonl" \
        "bf16 under the reverse schedule"
    cmp -s <(state_of "$work/bf16/ckpt_00000010.bin") <(state_of "$work/reverse/ckpt_00000010.bin") ||
        fail "the step-10 checkpoints differ between cudasim's forward and reverse schedules"
fi

# --- across devices -------------------------------------------------------------------------
flat=("${small[@]}" optim.min_lr=1e-3 optim.warmup_steps=0)
train "$cfg" "${flat[@]}" train.out_dir="$work/cpu10"
expect_rc 0 "cpu, 10 steps"

train "$cfg" "${flat[@]}" train.steps=5 train.out_dir="$work/c2g"
expect_rc 0 "cpu, 5 steps"
train_cuda "$cfg" "${flat[@]}" train.dtype=fp32 train.resume=1 train.out_dir="$work/c2g"
expect_rc 0 "cuda fp32 resuming the cpu run"
expect_out_line "resuming from '$work/c2g/ckpt_00000005.bin' at step 5"
curves_close "$work/cpu10/metrics.jsonl" "$work/c2g/metrics.jsonl" 1e-3 \
    "a cpu checkpoint resumed on cuda against 10 cpu steps"

train_cuda "$cfg" "${flat[@]}" train.dtype=fp32 train.steps=5 train.out_dir="$work/g2c"
expect_rc 0 "cuda fp32, 5 steps"
train "$cfg" "${flat[@]}" train.resume=1 train.out_dir="$work/g2c"
expect_rc 0 "cpu resuming the cuda run"
expect_out_line "resuming from '$work/g2c/ckpt_00000005.bin' at step 5"
curves_close "$work/cpu10/metrics.jsonl" "$work/g2c/metrics.jsonl" 1e-3 \
    "a cuda checkpoint resumed on cpu against 10 cpu steps"

# bf16 master weights are fp32 in the file: a bf16 checkpoint resumes on cpu too.
train "$cfg" "${small[@]}" train.resume=1 train.steps=12 train.out_dir="$work/bf16"
expect_rc 0 "cpu resuming the cuda bf16 run"
expect_out_line "resuming from '$work/bf16/ckpt_00000010.bin' at step 10"
ok "a bf16 checkpoint resumed on cpu: loss $(loss_at "$work/bf16/metrics.jsonl" 12) at step 12"

# --- an llm.c checkpoint as init_from -----------------------------------------------------------
# le32 N: N as 4 little-endian bytes.
le32() {
    printf '%b' "$(printf '\\x%02x\\x%02x\\x%02x\\x%02x' $(($1 & 255)) $(($1 >> 8 & 255)) \
        $(($1 >> 16 & 255)) $(($1 >> 24 & 255)))"
}
# The parameters of the cpu run's step-5 checkpoint in llm.c's layout (the model of
# train_common.sh: maxT 32, V 256, L 2, NH 2, C 32, Vp 256).
src=$work/c2g/ckpt_00000005.bin
nparams=$(od -An -t u8 -j 56 -N 8 "$src" | tr -d ' ')
clen=$(od -An -t u8 -j 144 -N 8 "$src" | tr -d ' ')
{
    for v in 20240326 3 32 256 2 2 32 256; do le32 "$v"; done
    head -c $((1024 - 32)) /dev/zero
    dd if="$src" iflag=skip_bytes,count_bytes skip=$((256 + clen)) count=$((4 * nparams)) \
        status=none
} >"$work/llmc.bin"
train "$cfg" "${flat[@]}" train.steps=3 model.init_from="$work/llmc.bin" train.out_dir="$work/lc"
expect_rc 0 "cpu from an llm.c checkpoint"
train_cuda "$cfg" "${flat[@]}" train.dtype=fp32 train.steps=3 model.init_from="$work/llmc.bin" \
    train.out_dir="$work/lg"
expect_rc 0 "cuda from an llm.c checkpoint"
expect_out_line "starting from '$work/llmc.bin' (llm.c checkpoint)"
curves_close "$work/lc/metrics.jsonl" "$work/lg/metrics.jsonl" 1e-4 \
    "3 steps from an llm.c checkpoint, cuda fp32 against cpu"

# --- SIGTERM ----------------------------------------------------------------------------------
# Finishes the step, saves, exits 0; the resumed run ends where an uninterrupted one does.
"$cuda_bin" "$cfg" "${flat[@]}" train.device=cuda train.steps=1000000 train.log_every=1000 \
    train.out_dir="$work/sig" >"$work/out" 2>"$work/err" </dev/null &
pid=$!
bg_pids+=("$pid")
for ((i = 0; i < 600; i++)); do
    [ -f "$work/sig/metrics.jsonl" ] && [ "$(wc -l <"$work/sig/metrics.jsonl")" -ge 3 ] && break
    sleep 0.1
done
kill -TERM "$pid"
rc=0
wait "$pid" || rc=$?
expect_rc 0 "cuda gpurun-train after SIGTERM"
k=$(losses "$work/sig/metrics.jsonl" | tail -n 1 | cut -d' ' -f1)
expect_out_line "stopped by a signal after step $k; continue with train.resume=1"
[ -f "$(printf '%s/sig/ckpt_%08d.bin' "$work" "$k")" ] ||
    fail "no checkpoint of step $k after SIGTERM: $(ls "$work/sig")"
end=$((k + 3))
train_cuda "$cfg" "${flat[@]}" train.steps="$end" train.resume=1 train.out_dir="$work/sig"
expect_rc 0 "cuda, resumed after SIGTERM to step $end"
train_cuda "$cfg" "${flat[@]}" train.steps="$end" train.out_dir="$work/nosig"
expect_rc 0 "cuda, $end steps without a signal"
same_losses "$work/nosig/metrics.jsonl" "$work/sig/metrics.jsonl" \
    "stopped by SIGTERM after step $k and resumed to $end"
