#!/bin/bash
# A fenced node stays out of the requeued job, on a 4-node test cluster. A 2-node job with
# --spare-nodes 1 and --max-requeues 1: node 1's rendezvousd is SIGKILLed, the spare takes
# its place (generation 1); then the pre-timeout signal: the ranks checkpoint and the batch
# script requeues the job. gpurun --wait, following it, sets the pending job's ExcNodeList to
# the fenced host, and segment 1 runs on the three other nodes (without gpurun --wait the
# next segment's leader refuses the host at pre-flight: netns_preflight_link tests that).
# timeout: 300
# lane: side
set -euo pipefail
export GR_SLURM_NODES=4
# shellcheck source=slurm_client_common.sh
. "$(dirname "$0")/slurm_client_common.sh"

rank=$(cd "$here/../.." && pwd)/tests/ranks/preempt_rank.py

# wait_lines FILE REGEX N: waits (up to 60 s) until N lines of FILE match REGEX.
wait_lines() {
    local i n
    for ((i = 0; i < 300; i++)); do
        n=$(grep -cE "$2" "$1" 2>/dev/null || true)
        [ "${n:-0}" -ge "$3" ] && return 0
        sleep 0.2
    done
    grs_fail "$1 has not $3 lines of '$2' after 60 s: $(tail -n 20 "$1")
$(scontrol show job -o)"
}

timeout 240 "$gpurun" --wait -N 2 --gpus-per-node 1 --spare-nodes 1 --max-restarts 1 \
    --max-requeues 1 --kill-grace 1 -J fenced -- "$py" "$rank" resume 100000 \
    >a.out 2>a.err </dev/null &
pid=$!
wait_lines a.out '^\[[01]\] rank [01] resume up$' 2
id=$(job_id a.out)
[ -n "$id" ] || grs_fail "no job id: $(head -n 3 a.out)"
dir=$GPURUN_JOBS/$id
victim=$(daemon_pid "$id" 1)
[ -n "$victim" ] || grs_fail "no rendezvousd of node 1"
kill -KILL "$victim"
wait_lines a.out '^\[[01]\] rank [01] resume up$' 4
sleep 1
scancel --batch --signal=USR1 "$id"
wait_lines a.err "requeued: the nodes it fenced are excluded" 1
fenced=$(json "$dir/segments/0.json" '[n["hostname"] for n in v["nodes"] if n["state"] == "fenced"]' 2>/dev/null ||
    json "$dir/summary.json" '[n["hostname"] for n in v["nodes"] if n["state"] == "fenced"]')
host=$(echo "$fenced" | sed -n "s/^\['\(node[0-9]*\)'\]$/\1/p")
[ -n "$host" ] || grs_fail "segment 0 fenced '$fenced', not one node"
grep -qF "gpurun: job $id requeued: the nodes it fenced are excluded from it (ExcNodeList $host): $host" a.err ||
    grs_fail "gpurun --wait did not say the exclusion: $(cat a.err)"
[ "$(job_field "$id" ExcNodeList)" = "$host" ] ||
    grs_fail "ExcNodeList is '$(job_field "$id" ExcNodeList)', not $host"
release "$id"
wait_lines a.out '^\[[01]\] rank [01] resumed at step [0-9]+$' 2
nodes=$(job_field "$id" NodeList)
echo "# segment 0 fenced $host; segment 1 runs on $nodes"
[[ ",$(scontrol show hostnames "$nodes" | paste -sd,)," != *",$host,"* ]] ||
    grs_fail "segment 1 runs on the fenced $host: $nodes"
sleep 1
scancel --batch --signal=USR1 "$id"
rc=0
wait "$pid" || rc=$?
[ "$rc" = 0 ] || grs_fail "gpurun --wait exited $rc: $(tail -n 20 a.out; cat a.err)"
[ "$(job_field "$id" JobState)" = COMPLETED ] || grs_fail "job: $(scontrol show job -o "$id")"
[ "$(json "$dir/summary.json" 'v["segments"][0].get("fenced")')" = "['$host']" ] ||
    grs_fail "summary's segment 0 does not list $host as fenced: $(json "$dir/summary.json" 'v["segments"]')"

echo "ok - $host fenced in segment 0 and kept out of segment 1 (ExcNodeList)"
