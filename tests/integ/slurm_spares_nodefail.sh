#!/bin/bash
# A node dies whole on the Slurm test cluster: a 2-node job with --spare-nodes 1, node 1's
# slurmd and rendezvousd both SIGKILLed. The leader fences node 1 and the spare runs its rank
# in generation 1; Slurm, which no longer hears the node's slurmd, marks it DOWN (SlurmdTimeout)
# while the job runs on, and does not end the job (gpurun's --no-kill with spares): the job
# completes, COMPLETED and exit 0. The cluster's SlurmdTimeout is 10 s, not 30, for a shorter
# wait.
# timeout: 240
# lane: side
set -euo pipefail
export GR_SLURM_SLURMD_TIMEOUT=10
# shellcheck source=slurm_client_common.sh
. "$(dirname "$0")/slurm_client_common.sh"

node_state() {
    scontrol show node -o "$1" | tr ' ' '\n' | sed -n 's/^State=//p'
}

# Generation 1 runs until the test says the node is down (the file 'go'), at most 150 s.
# shellcheck disable=SC2016 # expanded by each rank
timeout 220 "$gpurun" --wait -N 2 --gpus-per-node 1 --spare-nodes 1 --max-restarts 1 \
    --kill-grace 1 -- sh -c 'echo "gen $GPURUN_RESTART_COUNT rank $RANK on $(hostname)"
if [ "$GPURUN_RESTART_COUNT" = 0 ]; then exec sleep 3012; fi
for i in $(seq 750); do [ -e "$0/go" ] && exit 0; sleep 0.2; done; exit 9' "$GRS_WORK" \
    >nf.out 2>nf.err </dev/null &
gpid=$!
for ((i = 0; i < 150; i++)); do
    [ "$(grep -c '^\[[01]\] gen 0 ' nf.out 2>/dev/null || true)" = 2 ] && break
    sleep 0.2
done
[ "$(grep -c '^\[[01]\] gen 0 ' nf.out)" = 2 ] || grs_fail "generation 0 did not start: $(tail -n 5 nf.err)"
id=$(job_id nf.out)
host=$(sed -n 's/^\[1\] gen 0 rank 1 on \(node[0-9]*\)$/\1/p' nf.out)
[ -n "$host" ] || grs_fail "no host of rank 1: $(cat nf.out)"
k=${host#node}
victim=$(daemon_pid "$id" 1)
[ -n "$victim" ] || grs_fail "no rendezvousd of node 1"
kill -KILL "$(grs_slurmd_pid "$k")" "$victim"
# Slurm notices the silent slurmd: the node goes DOWN (or NOT_RESPONDING first).
for ((i = 0; i < 600; i++)); do
    case $(node_state "$host") in
    DOWN*) break ;;
    esac
    sleep 0.2
done
state=$(node_state "$host")
[[ $state == DOWN* ]] || grs_fail "$host is '$state' 120 s after its slurmd was killed"
[ "$(scontrol show job -o "$id" | tr ' ' '\n' | sed -n 's/^JobState=//p')" = RUNNING ] ||
    grs_fail "the job did not outlive $host: $(scontrol show job -o "$id")"
touch "$GRS_WORK/go"
rc=0
wait "$gpid" || rc=$?
[ "$rc" = 0 ] || grs_fail "--wait exited $rc: $(tail -n 5 nf.err)"
summary=$GPURUN_JOBS/$id/summary.json
[ "$(json "$summary" '[(s["node"], s["spare"], s["generation"]) for s in v["swaps"]]')" = "[(1, 2, 1)]" ] ||
    grs_fail "swaps: $(json "$summary" 'v.get("swaps")')"
[ "$(scontrol show job -o "$id" | tr ' ' '\n' | sed -n 's/^JobState=//p')" = COMPLETED ] ||
    grs_fail "job: $(scontrol show job -o "$id")"
echo "ok - $host died whole (slurmd and rendezvousd): Slurm marked it $state, the job ran on with the spare and completed"
