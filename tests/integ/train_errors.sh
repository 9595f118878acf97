#!/usr/bin/env bash
# What gpurun-train refuses, each with its one line naming the file and line (or the command
# line) and what is wrong, and exit status 1: config errors, CUDA in a CPU build, broken or too
# small token shards, a shard cut while the run reads it, a read-only out_dir, a resume whose
# checkpoint does not fit the model or the data or is damaged; gpurun itself refuses a bad
# train.cfg (125) before it starts anything. And the llm.c import: a checkpoint exported in
# llm.c's layout starts a run exactly where the run that saved it stood.
# timeout: 180
set -euo pipefail
# shellcheck source=train_common.sh
. "$(dirname "$0")/train_common.sh"

cd "$work"
# expect_error LINE ARGS...: gpurun-train ARGS fails with exit 1 and LINE as its stderr.
expect_error() {
    local want=$1
    shift
    train "$@"
    expect_rc 1 "gpurun-train $*"
    [ "$(cat "$work/err")" = "gpurun-train: $want" ] ||
        fail "gpurun-train $*: stderr is '$(cat "$work/err")', expected 'gpurun-train: $want'"
}

# le32 N: N as 4 little-endian bytes.
le32() {
    printf '%b' "$(printf '\\x%02x\\x%02x\\x%02x\\x%02x' $(($1 & 255)) $(($1 >> 8 & 255)) \
        $(($1 >> 16 & 255)) $(($1 >> 24 & 255)))"
}

# --- the config -------------------------------------------------------------------------------
line_of() {
    grep -n "^$1 " small.cfg | cut -d: -f1
}
cp "$cfg" bad.cfg
sed -i 's/^n_head = 2/n_head = 5/' bad.cfg
# A check between two keys names the line of the one set last: n_embd, below n_head.
expect_error "bad.cfg:$(line_of n_embd): n_head (5) must divide n_embd (32)" bad.cfg
expect_error "command line: 'train.stepz': unknown key" small.cfg train.stepz=3
expect_error "command line: 'train.steps': -3 is out of range 1..1000000000" small.cfg train.steps=-3
# A build with the CUDA backend (linked with cudart) answers for the device instead:
# train_cuda_nodevice.sh checks that.
if ! ldd "$train_bin" 2>/dev/null | grep 'libcudart\.so' >/dev/null; then
    expect_error "command line: device 'cuda': this gpurun-train has no CUDA backend (built without nvcc); use device = cpu" \
        small.cfg train.device=cuda
    sed 's/^threads = 1/device = cuda/' small.cfg >cuda.cfg
    expect_error "cuda.cfg:$(line_of threads): device 'cuda': this gpurun-train has no CUDA backend (built without nvcc); use device = cpu" \
        cuda.cfg
fi
expect_error "cannot read 'nosuch.cfg': No such file or directory" nosuch.cfg

# gpurun reads the same file first and starts nothing for a bad one.
run --local bad.cfg
expect_rc 125 "gpurun with a bad train.cfg"
expect_err "gpurun: bad.cfg:$(line_of n_embd): n_head (5) must divide n_embd (32)"

# --- the data ---------------------------------------------------------------------------------
mkdir bad
expect_error "command line: data.train: 'bad/train_*.bin': no file matches (token shards are made by 'gpurun-train prep')" small.cfg \
    data.train='bad/train_*.bin'
head -c 4096 /dev/zero >bad/zero.bin
expect_error "command line: data.train: 'bad/zero.bin': not a token shard (magic 0, expected 20240520)" \
    small.cfg data.train=bad/zero.bin
head -c 2000 data/train_000000.bin >bad/cut.bin
n=$(od -An -t d4 -j 8 -N 4 data/train_000000.bin | tr -d ' ')
expect_error "command line: data.train: 'bad/cut.bin': truncated: the header says $n tokens, the file holds 488" \
    small.cfg data.train=bad/cut.bin
# The first byte of the text is a newline (10).
expect_error "small.cfg:$(line_of train): data.train: 'data/train_000000.bin': token 10 at position 0 is not below vocab_size 10" \
    small.cfg model.vocab_size=10
nv=$(od -An -t d4 -j 8 -N 4 data/val_000000.bin | tr -d ' ')
expect_error "small.cfg:$(line_of val): data.val: 'data/val_*.bin': too few tokens: $nv tokens make $(((nv - 1) / 32)) sequences of 32+1, one step needs 400 (1 ranks x batch_size 400 x grad_accum 1)" \
    small.cfg train.batch_size=400
# A shard cut while a run reads it (in place: the open file shrinks): the read that meets the
# cut is one line naming the file and both sizes, exit 1 (through mmap it was SIGBUS, status
# 135, and no line).
mkdir shrink
cp data/train_000000.bin shrink/s.bin
full=$(stat -c %s shrink/s.bin)
timeout -k 5 "$TRAIN_LIMIT" "$train_bin" small.cfg data.train=shrink/s.bin train.steps=1000000 \
    train.eval_every=0 train.out_dir=shrink/out >"$work/out" 2>"$work/err" </dev/null &
pid=$!
bg_pids+=("$pid")
wait_for_lines shrink/out/metrics.jsonl 3
truncate -s 2000 shrink/s.bin
rc=0
wait "$pid" || rc=$?
bg_pids=()
expect_rc 1 "a run whose shard was cut under it"
grep -qx "gpurun-train: step [0-9]*: data shard 'shrink/s.bin' shrank from $full to 2000 bytes while training read it" \
    "$work/err" || fail "stderr is '$(cat "$work/err")', expected the shrunk shard named"
[ "$(wc -l <"$work/err")" = 1 ] || fail "stderr has more than the one line: $(cat "$work/err")"
echo "# a shard cut under the run named"

# --- out_dir --------------------------------------------------------------------------------
# A read-only out_dir is named before anything is loaded (it was "cannot remove
# 'ro/out/metrics.jsonl'", a file that is not there). Root writes through file modes, so the
# dir is a read-only tmpfs, mounted in a mount namespace of this test's own.
mkdir ro
if unshare -m mount -t tmpfs tmpfs ro 2>/dev/null; then
    rc=0
    # shellcheck disable=SC2016 # $0 and $1 are the inner shell's: the limit and gpurun-train
    unshare -m sh -c 'mount -t tmpfs tmpfs ro && mkdir ro/out && mount -o remount,ro ro &&
        exec timeout -k 5 "$0" "$1" small.cfg train.out_dir=ro/out' \
        "$TRAIN_LIMIT" "$train_bin" >"$work/out" 2>"$work/err" </dev/null || rc=$?
    expect_rc 1 "a run with a read-only out_dir"
    [ "$(cat "$work/err")" = "gpurun-train: out_dir 'ro/out': not writable (Read-only file system)" ] ||
        fail "read-only out_dir: stderr is '$(cat "$work/err")'"
    [ ! -s "$work/out" ] || fail "read-only out_dir: the run printed '$(cat "$work/out")'"
    # Under gpurun the nodes' pre-flight names it before any rank starts: every node, 125.
    rc=0
    # shellcheck disable=SC2016 # $0, $1 and $2 are the inner shell's
    unshare -m sh -c 'mount -t tmpfs tmpfs ro && mount -o remount,ro ro &&
        exec timeout -k 5 "$0" "$1" --local -N 2 --job-dir "$2" small.cfg train.out_dir=ro/new' \
        "$TRAIN_LIMIT" "$gpurun" "$work/pf" >"$work/out" 2>"$work/err" </dev/null || rc=$?
    expect_rc 125 "gpurun with an out_dir that cannot be made"
    # Each node once, by the leader: the job ends on node 0, node 1 is named beside it.
    for k in 0 1; do
        [ "$(grep -F "node $k ('" "$work/err" | grep -cF "') failed pre-flight: out_dir '$work/ro/new' cannot be made: '$work/ro' is not writable: Read-only file system")" = 1 ] ||
            fail "node $k's pre-flight does not name the out_dir: $(grep -i pre-flight "$work/err")"
    done
    [ "$(grep -c 'failed pre-flight' "$work/err")" = 2 ] ||
        fail "not one pre-flight line a node: $(grep -i pre-flight "$work/err")"
    [ "$(cat "$work"/pf/logs/*.log 2>/dev/null | wc -c)" = 0 ] || fail "a rank ran: $(cat "$work"/pf/logs/*)"
elif [ "$(id -u)" != 0 ]; then
    # Without mount namespaces a mode that denies writing does, for anyone but root.
    mkdir ro/out
    chmod 555 ro/out
    expect_error "out_dir 'ro/out': not writable (Permission denied)" small.cfg train.out_dir=ro/out
    chmod 755 ro/out
else
    echo "# as root without mount namespaces (unshare -m): the read-only out_dir case is not run"
fi
echo "# a read-only out_dir named"

# --- resume -----------------------------------------------------------------------------------
train small.cfg train.steps=3 train.out_dir=r
expect_rc 0 "3 steps"
ck=r/ckpt_00000003.bin
expect_error "cannot resume: '$ck': n_layer is 2 in the checkpoint, 3 in the config" \
    small.cfg train.out_dir=r train.resume=1 model.n_layer=3
head -c 100000 data/train_000000.bin >half.bin
# A shard of fewer tokens: the header's count rewritten to what the cut file holds.
cnt=$(((100000 - 1024) / 2))
le32 "$cnt" | dd of=half.bin bs=1 seek=8 conv=notrunc status=none
expect_error "cannot resume: '$ck': the training data changed: $n tokens ($(((n - 1) / 32)) sequences) then, $cnt ($(((cnt - 1) / 32))) now in 'half.bin'" \
    small.cfg train.out_dir=r train.resume=1 data.train=half.bin
cp "$ck" saved.bin
size=$(stat -c %s "$ck")
printf '\x55' | dd of="$ck" bs=1 seek=$((size - 100)) conv=notrunc status=none
expect_error "cannot resume: '$ck': checksum mismatch: the file is damaged; no older checkpoint in 'r'" \
    small.cfg train.out_dir=r train.resume=1
echo "# config, data and resume errors named"

# --- llm.c import -----------------------------------------------------------------------------
# Data whose every sequence is the same 32 tokens (text of period 16): the loss of a step
# then depends on the parameters alone, so a run started from an exported checkpoint can be
# compared with the run that saved it.
for _ in $(seq 2000); do printf 'abcdefghijklmno\n'; done >periodic.txt
"$train_bin" prep periodic.txt -o periodic >/dev/null
per=(data.train=periodic/train_000000.bin data.val= optim.min_lr=1e-3 optim.warmup_steps=0)
train small.cfg "${per[@]}" train.steps=4 train.ckpt_every=3 train.out_dir=p
expect_rc 0 "4 steps on periodic data"
src=p/ckpt_00000003.bin
nparams=$(od -An -t u8 -j 56 -N 8 "$src" | tr -d ' ')
clen=$(od -An -t u8 -j 144 -N 8 "$src" | tr -d ' ')
{
    # magic, version 3, maxT, V, L, NH, C, Vp, then zeros to 1024 bytes; then the parameters.
    for v in 20240326 3 32 256 2 2 32 256; do le32 "$v"; done
    head -c $((1024 - 32)) /dev/zero
    dd if="$src" iflag=skip_bytes,count_bytes skip=$((256 + clen)) count=$((4 * nparams)) \
        status=none
} >llmc.bin
train small.cfg "${per[@]}" train.steps=1 model.init_from=llmc.bin train.out_dir=q
expect_rc 0 "a run from an llm.c checkpoint"
expect_out_line "starting from 'llmc.bin' (llm.c checkpoint)"
want=$(loss_at p/metrics.jsonl 4)
got=$(loss_at q/metrics.jsonl 1)
[ "$want" = "$got" ] || fail "from the llm.c export of step 3: loss $got, the run that saved it had $want"
echo "# llm.c import: step 1 from the export of step 3 has the loss of step 4 ($got)"
expect_error "command line: 'llmc.bin': n_layer is 2 in the checkpoint, 3 in [model]" \
    small.cfg "${per[@]}" model.init_from=llmc.bin model.n_layer=3 train.out_dir=l
expect_error "command line: model.init_from: 'periodic/train_000000.bin': not an llm.c GPT-2 checkpoint (magic 20240520, expected 20240326)" \
    small.cfg "${per[@]}" model.init_from=periodic/train_000000.bin train.out_dir=l
