#!/bin/bash
# gpurun-train on cuda regrouping in process over NCCL on the Slurm test cluster: 2 nodes of 1
# rank and a spare, network namespaces of their own, train.device=cuda (the real build where a
# GPU is, else cudasim: GPURUN_TRAIN_SIM); past step 40 node 1's rendezvousd is SIGKILLed.
# Rank 0's NCCL collective fails, it keeps its process and makes a new communicator with the
# spare's new rank; every later loss and the final parameters and moments equal an undisturbed
# run's, bit for bit (tests/integ/train_cuda_regroup.sh does the same under gpurun --local).
# timeout: 300
# lane: side
set -euo pipefail
# shellcheck source=slurm_client_common.sh
. "$(dirname "$0")/slurm_client_common.sh"

bin=${GPURUN_TRAIN_SIM:-}
flavour=cudasim
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU ' &&
    ldd "$GRS_BUILD/gpurun-train" 2>/dev/null | grep -q 'libcudart\.so'; then
    bin=$GRS_BUILD/gpurun-train flavour=cuda
fi
if [ -z "$bin" ] || [ ! -x "$bin" ]; then
    echo "# SKIP no CUDA device here (nvidia-smi -L) and no cudasim build (GPURUN_TRAIN_SIM unset)"
    exit 77
fi
texts=()
while IFS= read -r f; do
    texts+=("$f")
done < <(find /usr/share/common-licenses -maxdepth 1 -type f | LC_ALL=C sort)
[ ${#texts[@]} -gt 0 ] || { echo "# SKIP no texts in /usr/share/common-licenses"; exit 77; }
"$bin" prep "${texts[@]}" -o "$GRS_WORK/data" >prep.out 2>&1 || grs_fail "prep: $(cat prep.out)"

steps=120 at=40
[ "$flavour" = cuda ] && steps=3000 at=1000
cat >train.cfg <<CFG
[model]
n_layer = 2
n_head = 2
n_embd = 32
seq_len = 32
vocab_size = 256

[data]
train = $GRS_WORK/data/train_*.bin

[optim]
lr = 1e-3
min_lr = 1e-4
warmup_steps = 2
grad_clip = 1.0

[train]
batch_size = 4
steps = $steps
eval_every = 0
ckpt_every = 0
log_every = 1
seed = 7
threads = 1
sample_tokens = 0
device = cuda
dtype = fp32
CFG

# losses DIR: "step loss" of DIR/metrics.jsonl.
losses() {
    sed -nE 's/.*"step": ([0-9]+), "loss": ([^,]*),.*/\1 \2/p' "$1/metrics.jsonl"
}

# state_of CKPT: the parameters and both moments of a checkpoint.
state_of() {
    local n size
    n=$(od -An -t u8 -j 56 -N 8 "$1" | tr -d ' ')
    size=$(stat -c %s "$1")
    dd if="$1" iflag=skip_bytes,count_bytes skip=$((size - 12 * n - 32)) count=$((12 * n)) \
        status=none
}

rc=0
timeout 200 "$gpurun" --wait -N 2 --gpus-per-node 1 -- "$bin" train.cfg \
    "train.out_dir=$GRS_WORK/calm" >calm.out 2>calm.err </dev/null || rc=$?
[ "$rc" = 0 ] || grs_fail "the undisturbed run exited $rc: $(tail -n 5 calm.err calm.out)"
grep -q '^\[0\] run: .*, nccl: 2 ranks' calm.out ||
    grs_fail "the run line does not show NCCL over 2 ranks: $(grep '^\[0\] run:' calm.out)"

timeout 200 "$gpurun" --wait -N 2 --gpus-per-node 1 --spare-nodes 1 --max-restarts 1 \
    --kill-grace 1 -- "$bin" train.cfg "train.out_dir=$GRS_WORK/hit" >hit.out 2>hit.err \
    </dev/null &
gpid=$!
for ((i = 0; i < 3000; i++)); do
    [ -s "$GRS_WORK/hit/metrics.jsonl" ] && [ "$(wc -l <"$GRS_WORK/hit/metrics.jsonl")" -ge "$at" ] && break
    sleep 0.05
done
[ "$(wc -l <"$GRS_WORK/hit/metrics.jsonl" 2>/dev/null || echo 0)" -ge "$at" ] ||
    grs_fail "the run never got past step $at: $(tail -n 5 hit.out)"
victim=$(daemon_pid "$(job_id hit.out)" 1)
[ -n "$victim" ] || grs_fail "no rendezvousd of node 1"
kill -KILL "$victim"
rc=0
wait "$gpid" || rc=$?
[ "$rc" = 0 ] || grs_fail "the run whose node 1 was lost exited $rc: $(tail -n 5 hit.err hit.out)"
grep -q "node 1 lost: the ranks of the other nodes regroup in process" hit.out hit.err ||
    grs_fail "the leader did not regroup in process: $(grep -h -m3 'lost\|regroup\|restart' hit.out hit.err)"
[ "$(grep -c '^\[0\] run: ' hit.out)" = 1 ] || grs_fail "rank 0 started more than once"
grep -m1 '^\[0\] a peer was lost' hit.out | grep -q nccl ||
    grs_fail "the failure rank 0 names is not NCCL's: $(grep -m1 '^\[0\] a peer was lost' hit.out)"
from=$(sed -n 's/^\[0\] regrouped in process as generation 1: going on from step \([0-9]*\) (the live state of rank 0)$/\1/p' hit.out)
[ -n "$from" ] || grs_fail "rank 0 did not regroup: $(grep -m3 'peer\|regroup' hit.out)"
diff <(losses "$GRS_WORK/calm" | awk -v f="$from" '$1 > f') \
    <(losses "$GRS_WORK/hit" | awk -v f="$from" '$1 > f') >diff.out ||
    grs_fail "the losses after the regroup differ: $(head -n 6 diff.out)"
[ "$(losses "$GRS_WORK/hit" | awk -v f="$from" '$1 > f' | wc -l)" = $((steps - from)) ] ||
    grs_fail "not one loss a step after step $from"
final=$(printf 'ckpt_%08d.bin' "$steps")
cmp -s <(state_of "$GRS_WORK/calm/$final") <(state_of "$GRS_WORK/hit/$final") ||
    grs_fail "the step-$steps checkpoints' parameters and moments differ"
echo "ok - ($flavour) node 1 lost on Slurm: rank 0 kept its process, a new NCCL communicator with the spare from step $from; bit for bit the undisturbed run"
