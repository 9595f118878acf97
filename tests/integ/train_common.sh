# Shared by the tests/integ/train_*.sh scripts (sourced, not run): the local_common.sh helpers
# plus gpurun-train, a small byte-level data set made with `gpurun-train prep` from Debian's
# licence texts, a small model's train.cfg, and helpers that read metrics.jsonl. Skips (exit
# 77) when gpurun-train is not built.
# shellcheck shell=bash
# shellcheck source=local_common.sh
. "$(dirname "${BASH_SOURCE[0]}")/local_common.sh"

train_bin=$build/gpurun-train
[ -x "$train_bin" ] || skip "'$train_bin' is not built (make)"
# A bound on every training run of these tests: each takes seconds.
TRAIN_LIMIT=${TRAIN_LIMIT:-120}

# The data: ~300 KB of licence texts, the last 5% for validation.
data=$work/data
texts=()
while IFS= read -r f; do
    texts+=("$f")
done < <(find /usr/share/common-licenses -maxdepth 1 -type f | LC_ALL=C sort)
[ ${#texts[@]} -gt 0 ] || skip "no texts in /usr/share/common-licenses (package base-files)"
"$train_bin" prep "${texts[@]}" -o "$data" >"$work/prep.out" 2>&1 || {
    cat "$work/prep.out"
    fail "gpurun-train prep failed"
}

# The small model of these tests: a step takes a few ms on one thread. Overrides on a command
# line change it per test.
cfg=$work/small.cfg
cat >"$cfg" <<'CFG'
# the integration tests' model
[job]
gpus_per_node = 2

[model]
n_layer = 2
n_head = 2
n_embd = 32
seq_len = 32
vocab_size = 256

[data]
train = data/train_*.bin
val = data/val_*.bin

[optim]
lr = 1e-3
min_lr = 1e-4
warmup_steps = 2
grad_clip = 1.0

[train]
batch_size = 4
steps = 10
eval_every = 5
eval_batches = 2
out_dir = out
seed = 7
threads = 1
sample_tokens = 0
CFG

# state_of CKPT: the parameters and both moments of a checkpoint, the 3 x nparams floats
# before the 32-byte checksum (nparams: the header's uint64 at byte 56).
state_of() {
    local n size
    n=$(od -An -t u8 -j 56 -N 8 "$1" | tr -d ' ')
    size=$(stat -c %s "$1")
    dd if="$1" iflag=skip_bytes,count_bytes skip=$((size - 12 * n - 32)) count=$((12 * n)) \
        status=none
}

# train ARGS...: gpurun-train ARGS (one rank, no launcher), stdout in $work/out and stderr in
# $work/err; sets rc.
train() {
    rc=0
    timeout -k 5 "$TRAIN_LIMIT" "$train_bin" "$@" >"$work/out" 2>"$work/err" </dev/null || rc=$?
}

# losses FILE: "step loss lr grad_norm [val_loss]" per line of a metrics.jsonl, the numbers as
# written (tokens_per_s, a timing, left out).
losses() {
    sed -e 's/"tokens_per_s": [^,]*, //' -e 's/[{}",]//g' -e 's/[a-z_]*: //g' "$1"
}

# loss_at FILE STEP: the loss written for STEP.
loss_at() {
    losses "$1" | awk -v s="$2" '$1 == s { print $2; found = 1 } END { exit !found }' ||
        fail "'$1' has no line for step $2"
}

# steps_of FILE: the steps a metrics.jsonl holds, space-separated.
steps_of() {
    losses "$1" | awk '{ printf "%s%s", sep, $1; sep = " " }'
}
