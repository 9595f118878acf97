#!/usr/bin/env bash
# Memory checkpoints under gpurun --local (gpurun.memckpt; daemon/memckpt.c): two ranks save
# bytes and a torch state dict into their node's memory, one starts a third save it never
# finishes, then rank 1 is killed; the restarted generation loads each rank's own copies, whole
# and at their steps, not the torn one. A save over --mem-ckpt-max is refused with the sizes
# said and the older copy stays. A node lost after its rank's copy reached the node holding
# its copies: the spare in its place fetches the copy from there. The log and gpurun status
# say where each rank's state came from; the node's directory of /dev/shm is gone after the
# job. Both copies of a rank's state lost (its node and its holder): it has none. A transfer cut
# halfway leaves the older copy; a flood of saves leaves the newest on the holder while the
# job's store answers.
# Uses Debian's python3-torch (/usr/bin/python3, or $TORCH_PYTHON); skips without it.
# timeout: 120
set -euo pipefail
# shellcheck source=local_common.sh
. "$(dirname "$0")/local_common.sh"

python=${TORCH_PYTHON:-/usr/bin/python3}
[ -x "$python" ] || skip "no '$python'"
"$python" -c 'import importlib.util as u; assert u.find_spec("torch")' >/dev/null 2>&1 ||
    skip "'$python' has no torch (Debian's python3-torch)"
job=$root/tests/python/memckpt_job.py

run --local --gpus-per-node 2 --max-restarts 1 --log-level info --job-dir "$work/restart" -- \
    "$python" "$job" restart
expect_rc 0 "the restarted job"
for r in 0 1; do
    w=$((r + 1))
    grep -qF "[$r] rank $r generation 1: state step 5 b'hello from rank $r'; sd step 7 w [0.0, $w.0, $((2 * w)).0, $((3 * w)).0, $((4 * w)).0, $((5 * w)).0]" "$work/out" ||
        fail "rank $r did not load its own copies: $(grep "^\[$r\]" "$work/out" | tail -n 3)"
done
for r in 0 1; do
    grep -q "rank $r takes its memory checkpoint 'state' of step 5 (.* bytes) from node 0's memory" "$work/err" ||
        fail "the log does not say where rank $r's state came from"
done
id=$(sed -n 's/.*"job_id": *"\([^"]*\)".*/\1/p' "$work/restart/job.json" | head -n 1)
[ -n "$id" ] || fail "no job id in job.json"
ls -d /dev/shm/gpurun-"$id"-n* 2>/dev/null && fail "the memory checkpoints outlived the job"

# A node lost: its daemon killed after its rank's copy reached node 0, the node that holds
# node 1's copies; the spare in node 1's place fetches it from there.
run --local -N 2 --gpus-per-node 1 --spare-nodes 1 --kill-grace 1 --log-level info \
    --job-dir "$work/spare" -- "$python" "$job" spare
expect_rc 0 "the job whose node 1 was lost"
for r in 0 1; do
    grep -qF "[$r] rank $r generation 1 node_rank $r: state step 11 b'state of rank $r'" "$work/out" ||
        fail "rank $r did not load its copy after the swap: $(grep "^\[$r\]" "$work/out" | tail -n 3)"
done
grep -q "rank 1 takes its memory checkpoint 'state' of step 11 (.* bytes) from node 0's memory (its replica: this node had none)" "$work/err" ||
    fail "the log does not say that rank 1's state came from node 0's replica: $(grep 'takes its memory' "$work/err")"
grep -q "rank 0 takes its memory checkpoint 'state' of step 11 (.* bytes) from node 0's memory$" "$work/err" ||
    fail "the log does not say that rank 0's state came from its own node"
grep -q "node 0 sends its 1 memory checkpoint to node 2, its new holder" "$work/err" ||
    fail "node 0 did not send its copy to the spare, its new holder"
# gpurun status (of the ended job: its summary.json) says where each rank's state came from.
run status --job-dir "$work/spare"
expect_rc 0 "gpurun status of the job whose node 1 was lost"
grep -qE '^rank +node +host +phase .* +state from( |$)' "$work/out" ||
    fail "status shows no 'state from' column: $(head -n 20 "$work/out")"
grep -qE '^0 +0 .* memory, step 11( |$)' "$work/out" ||
    fail "status does not say rank 0's state came from its node's memory: $(grep -E '^[01] ' "$work/out")"
grep -qE '^1 +2 .* node 0, step 11( |$)' "$work/out" ||
    fail "status does not say rank 1's state came from node 0 on the spare (node 2): $(grep -E '^[01] ' "$work/out")"
id=$(sed -n 's/.*"job_id": *"\([^"]*\)".*/\1/p' "$work/spare/job.json" | head -n 1)
ls -d /dev/shm/gpurun-"$id"-n* 2>/dev/null && fail "the memory checkpoints of the killed daemon outlived the job"

# Both copies of rank 1's state lost (its node and its holder, node 2): it has none and says
# so (a trainer's disk serves); ranks 0 and 2 load theirs, rank 2's from node 0, its holder.
run --local -N 3 --gpus-per-node 1 --spare-nodes 2 --max-restarts 1 --kill-grace 1 \
    --log-level info --job-dir "$work/both" -- "$python" "$job" both
expect_rc 0 "the job whose nodes 1 and 2 were lost"
grep -qF "[1] rank 1 generation 1: no copy, from disk" "$work/out" ||
    fail "rank 1 found a copy with both lost: $(grep '^\[1\]' "$work/out" | tail -n 3)"
for r in 0 2; do
    grep -qF "[$r] rank $r generation 1: state step 13 b'state of rank $r'" "$work/out" ||
        fail "rank $r did not load its copy with nodes 1 and 2 lost: $(grep "^\[$r\]" "$work/out" | tail -n 3)"
done
grep -q "rank 2 takes its memory checkpoint 'state' of step 13 (.* bytes) from node 0's memory (its replica: this node had none)" "$work/err" ||
    fail "the log does not say that rank 2's state came from node 0: $(grep 'takes its memory' "$work/err")"

run --local --gpus-per-node 1 --mem-ckpt-max 1 --job-dir "$work/cap" -- "$python" "$job" cap
expect_rc 0 "the job over the cap"
grep -qF "refused: mem_save 'small': rank 0's memory checkpoint 'small' (2097159 bytes) does not fit --mem-ckpt-max 1048576 bytes beside the 0 kept; the older copy stays" "$work/out" ||
    fail "the save over the cap was not refused as it should be: $(grep refused "$work/out")"
grep -qF "kept step 1, 100 bytes" "$work/out" || fail "the older copy did not stay: $(cat "$work/out")"

# A transfer cut: node 1's daemon killed while rank 1's 256 MiB copy crosses to node 0, which
# keeps the older copy whole; the spare's rank 1 loads that.
run --local -N 2 --gpus-per-node 1 --spare-nodes 1 --kill-grace 1 --log-level info \
    --job-dir "$work/cut" -- "$python" "$job" cut
expect_rc 0 "the job whose transfer was cut"
grep -q "node 0 refused rank 1's memory checkpoint 'state' from its peer: the transfer was cut at byte [0-9]* of 268435463" "$work/err" ||
    fail "node 0 does not say the transfer was cut: $(grep 'refused\|cut' "$work/err")"
grep -qF "[1] rank 1 generation 1: state step 1, 21 bytes, sha256 $(printf 'first state of rank 1' | sha256sum | cut -c1-16)" "$work/out" ||
    fail "rank 1 did not load its older copy whole: $(grep '^\[1\]' "$work/out" | tail -n 3)"
id=$(sed -n 's/.*"job_id": *"\([^"]*\)".*/\1/p' "$work/cut/job.json" | head -n 1)
ls /dev/shm/gpurun-"$id"-n*/*.in 2>/dev/null && fail "a cut transfer's part outlived the job"

# A flood of saves: 300 of 1 MiB from rank 1 while rank 0 times the job's store; node 0 ends
# with the newest copy (queued pushes coalesce) and the control plane stays responsive.
run --local -N 2 --gpus-per-node 1 --job-dir "$work/flood" -- "$python" "$job" flood
expect_rc 0 "the job of the flood"
grep -q "^\[1\] node 0 holds rank 1's newest copy (step 300)" "$work/out" ||
    fail "node 0 did not end with rank 1's newest copy: $(grep '^\[1\]' "$work/out")"
slowest=$(sed -n 's/^\[0\] store round trips during the flood: [0-9]*, the slowest \([0-9]*\) ms$/\1/p' "$work/out")
[ -n "$slowest" ] || fail "rank 0 timed no round trip: $(grep '^\[0\]' "$work/out")"
# A bound for the wiring (a control plane that waited for the copies would take seconds).
[ "$slowest" -lt 2000 ] || fail "a store round trip took $slowest ms during the flood"
echo "# flood: $(sed -n 's/^\[1\] saved //p' "$work/out"); rank 0's store round trips: slowest $slowest ms"
echo "# restart: both ranks loaded their copies from memory; a spare fetched its node's from node 0; both copies lost: none; the cap refused 2 MiB of 1; a cut transfer left the older copy"
