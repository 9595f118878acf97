#!/bin/bash
# A training job outlives a bad node on the Slurm test cluster: gpurun-train (CPU, 2 ranks on
# 2 nodes) with --spare-nodes 1 and --max-restarts 1; once its checkpoint of step 300 is
# written, node 1's rendezvousd is SIGKILLed (its ranks die with it). The leader fences node
# 1 and the spare takes its place, twice: with train.regroup=false every rank restarts and
# resumes from the newest checkpoint (rank 0's node's memory checkpoint, or the disk's); by
# default rank 0 keeps its process and regroups with the spare's new rank in process. Either
# way the job completes and every step after the loss has the loss of an undisturbed run of
# the same train.cfg, bit for bit, and the final checkpoint the same parameters and moments.
# timeout: 240
# lane: side
set -euo pipefail
# shellcheck source=slurm_client_common.sh
. "$(dirname "$0")/slurm_client_common.sh"

train_bin=$GRS_BUILD/gpurun-train
[ -x "$train_bin" ] || { echo "# SKIP '$train_bin' is not built (make)"; exit 77; }
texts=()
while IFS= read -r f; do
    texts+=("$f")
done < <(find /usr/share/common-licenses -maxdepth 1 -type f | LC_ALL=C sort)
[ ${#texts[@]} -gt 0 ] || { echo "# SKIP no texts in /usr/share/common-licenses"; exit 77; }
"$train_bin" prep "${texts[@]}" -o "$GRS_WORK/data" >prep.out 2>&1 || grs_fail "prep: $(cat prep.out)"

STEPS=3000
cat >train.cfg <<CFG
[model]
n_layer = 2
n_head = 2
n_embd = 32
seq_len = 32
vocab_size = 256

[data]
train = $GRS_WORK/data/train_*.bin
val = $GRS_WORK/data/val_*.bin

[optim]
lr = 1e-3
min_lr = 1e-4
warmup_steps = 2
grad_clip = 1.0

[train]
batch_size = 4
steps = $STEPS
eval_every = 0
ckpt_every = 100
seed = 7
threads = 1
sample_tokens = 0
CFG

# losses DIR: "step loss" of DIR/metrics.jsonl, the last line written for each step.
losses() {
    "$py" -c '
import json, sys
last = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    if "loss" in r:
        last[r["step"]] = r["loss"]
for s in sorted(last):
    print(s, repr(last[s]))' "$1/metrics.jsonl"
}

# --- the undisturbed run ----------------------------------------------------------------------
rc=0
timeout 150 "$gpurun" --wait -N 2 --gpus-per-node 1 train.cfg "train.out_dir=$GRS_WORK/calm" \
    >calm.out 2>calm.err </dev/null || rc=$?
[ "$rc" = 0 ] || grs_fail "the undisturbed run exited $rc: $(tail -n 5 calm.err)"

# The parameters and both moments of a checkpoint (its other fields say when and where it was
# written): the u64 count of parameters at offset 56, then 12 bytes each before the trailer.
state_of() {
    local n size
    n=$(od -An -t u8 -j 56 -N 8 "$1" | tr -d ' ')
    size=$(stat -c %s "$1")
    dd if="$1" iflag=skip_bytes,count_bytes skip=$((size - 12 * n - 32)) count=$((12 * n)) \
        status=none
}
losses "$GRS_WORK/calm" >calm.losses
[ "$(wc -l <calm.losses)" = "$STEPS" ] || grs_fail "the undisturbed run wrote $(wc -l <calm.losses) steps"

# hit NAME [OVERRIDE...]: a run whose node 1 dies after the checkpoint of step 300; the spare
# takes its place.
hit() {
    local name=$1 gpid id victim rc summary i
    shift
    timeout 150 "$gpurun" --wait -N 2 --gpus-per-node 1 --spare-nodes 1 --max-restarts 1 \
        --kill-grace 1 train.cfg "train.out_dir=$GRS_WORK/$name" "$@" >"$name.out" 2>"$name.err" </dev/null &
    gpid=$!
    for ((i = 0; i < 600; i++)); do
        [ -e "$GRS_WORK/$name/ckpt_00000300.bin" ] && break
        sleep 0.05
    done
    [ -e "$GRS_WORK/$name/ckpt_00000300.bin" ] ||
        grs_fail "$name: no checkpoint of step 300 within 30 s: $(tail -n 5 "$name.out")"
    id=$(job_id "$name.out")
    hit_id=$id
    victim=$(daemon_pid "$id" 1)
    [ -n "$victim" ] || grs_fail "$name: no rendezvousd of node 1"
    kill -KILL "$victim"
    rc=0
    wait "$gpid" || rc=$?
    [ "$rc" = 0 ] || grs_fail "$name: the run with a spare exited $rc: $(tail -n 5 "$name.err"; tail -n 5 "$name.out")"
    summary=$GPURUN_JOBS/$id/summary.json
    [ "$(json "$summary" '[(s["node"], s["spare"], s["generation"]) for s in v["swaps"]]')" = "[(1, 2, 1)]" ] ||
        grs_fail "$name: swaps: $(json "$summary" 'v.get("swaps")')"
}

# same NAME: run NAME's losses after step $from and its final parameters and moments are the
# undisturbed run's, bit for bit.
same() {
    local name=$1
    losses "$GRS_WORK/$name" >"$name.losses"
    awk -v r="$from" '$1 > r' calm.losses >calm.after
    awk -v r="$from" '$1 > r' "$name.losses" >"$name.after"
    [ -s calm.after ] || grs_fail "$name: no step after $from"
    cmp -s calm.after "$name.after" ||
        grs_fail "$name: the losses after step $from differ: $(diff calm.after "$name.after" | head -n 6)"
    cmp -s <(state_of "$GRS_WORK/calm/ckpt_0000$STEPS.bin") <(state_of "$GRS_WORK/$name/ckpt_0000$STEPS.bin") ||
        grs_fail "$name: the final checkpoints' parameters differ"
}

# Every rank restarted (train.regroup=false): from the memory checkpoint rank 0's node kept
# (saved with every disk checkpoint, after the file), or from the disk's when node 1 was lost
# between the two.
hit restart train.regroup=false
restart_id=$hit_id
from=$(sed -n -e "s/^\[0\] resuming from '.*' at step \([0-9][0-9]*\)$/\1/p" \
    -e "s/^\[0\] resuming from the memory checkpoint of step [0-9]* at step \([0-9][0-9]*\)$/\1/p" \
    restart.out | tail -n 1)
[ -n "$from" ] || grs_fail "rank 0 did not resume from a checkpoint: $(grep -i resum restart.out)"
[ "$from" -ge 300 ] || grs_fail "resumed from step $from, before the checkpoint of step 300"
kind=$(grep -q '^\[0\] resuming from the memory checkpoint' restart.out && echo memory || echo disk)
same restart
echo "# restart: node 1 lost after step 300's checkpoint; the spare took its place, the ranks resumed at step $((from + 1)) from the $kind checkpoint; $(wc -l <restart.after) steps to $STEPS have the undisturbed run's losses, the final parameters and moments are equal"

# In process (the default): rank 0 keeps running and regroups with the spare's new rank.
hit regroup
# The leader's log comes with the job's output.
grep -q "node 1 lost: the ranks of the other nodes regroup in process" regroup.out regroup.err ||
    grs_fail "the leader did not regroup in process: $(grep -h -m3 'lost\|regroup' regroup.out regroup.err)"
from=$(sed -n 's/^\[0\] regrouped in process as generation 1: going on from step \([0-9]*\) (the live state of rank 0)$/\1/p' regroup.out)
[ -n "$from" ] || grs_fail "rank 0 did not regroup: $(grep -m3 'peer\|regroup\|resum' regroup.out)"
[ "$(grep -c '^\[0\] model: GPT-2' regroup.out)" = 1 ] || grs_fail "rank 0 started more than once"
same regroup
# The killed daemon of the first run could not remove its memory checkpoints; the daemons
# that started on the cluster since (which shares one /dev/shm) did.
for d in /dev/shm/gpurun-"$restart_id"-n*; do
    [ -e "$d" ] && grs_fail "'$d', the killed daemon's memory checkpoints, outlived it"
done
echo "# regroup: node 1 lost after step 300's checkpoint; rank 0 kept its process and went on from step $from with the spare; the losses after it and the final parameters and moments are the undisturbed run's"
echo "ok - gpurun-train outlived node 1 on Slurm with a spare, on the undisturbed loss curve"
