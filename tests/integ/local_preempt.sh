#!/usr/bin/env bash
# The pre-timeout signal under `gpurun --local -t`, sent as Slurm sends it (a quarter of a
# short limit before it): a Python rank that asked for it (gpurun.on_preempt) checkpoints and
# exits 0 long before the limit, and its child process, in the same process group without a
# handler, does not get it (the signal goes to the process that asked, not its group). With
# --signal=USR1@5 every rank's whole group gets it instead, shell ranks included. The job's
# record (summary.json, gpurun status) says when the signal came, as on Slurm.
# timeout: 120
set -euo pipefail
# shellcheck source=local_common.sh
. "$(dirname "$0")/local_common.sh"

py=/usr/bin/python3
[ -x "$py" ] || py=python3
rank=$root/tests/ranks/preempt_rank.py

job=$work/pre
t0=$(date +%s%N)
run --local --gpus-per-node 2 -t 0:20 --job-dir "$job" -- "$py" "$rank" prepared-child
ms=$((($(date +%s%N) - t0) / 1000000))
expect_rc 0 "prepared ranks under -t 0:20"
for r in 0 1; do
    expect_out_line "[$r] rank $r: pre-timeout signal 10"
    expect_out_line "[$r] rank $r: child alive"
    grep -q "^step " "$job/ckpt-$r" || fail "rank $r wrote no checkpoint"
done
# A quarter of 20 s before the limit: at about 15 s, well before it.
{ [ "$ms" -ge 13000 ] && [ "$ms" -lt 19000 ]; } || fail "the job ended after $ms ms, not at about 15 s"
echo "# prepared ranks checkpointed $ms ms into a 20 s limit; their children were spared"
# The job's record says when the signal came, as on Slurm (the leader sent it on gpurun's
# request in the job dir, which is gone once taken).
at=$(python3 -c 'import json, sys
p = json.load(open(sys.argv[1])).get("preempt_signal") or {}
print(p.get("signal", ""), p.get("at_ms", ""))' "$job/summary.json")
read -r psig pat <<<"$at"
[ "$psig" = 10 ] || fail "summary.json's preempt_signal is '$at', not signal 10"
{ [ "$pat" -ge 14000 ] && [ "$pat" -lt 17000 ]; } ||
    fail "summary.json's preempt_signal came at $pat ms, not at about 15 s"
[ ! -e "$job/preempt" ] || fail "the pre-timeout request outlived the job"
timeout 10 "$gpurun" status --job-dir "$job" >"$work/status" 2>&1 || fail "gpurun status failed"
grep -qE '^outcome: completed \(the pre-timeout signal SIGUSR1 came 1[456]\.[0-9] s after the start\)$' \
    "$work/status" || { cat "$work/status"; fail "gpurun status does not say when the pre-timeout signal came"; }
echo "# summary.json and gpurun status record the pre-timeout signal at $pat ms"

# shellcheck disable=SC2016 # expanded by each rank
run --local --gpus-per-node 2 -t 0:20 --signal=USR1@15 -- sh -c \
    'trap "echo usr1 \$RANK; exit 0" USR1; while :; do sleep 0.05; done'
expect_rc 0 "shell ranks with --signal=USR1@15"
expect_out_line "[0] usr1 0"
expect_out_line "[1] usr1 1"
echo "# --signal=USR1@15: every rank got it, 15 s before the limit"
