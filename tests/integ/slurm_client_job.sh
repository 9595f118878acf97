#!/bin/bash
# gpurun on the real Slurm test cluster: a 2-node job with 2 ranks per node through libslurm
# and --wait. Every rank sees its RANK, WORLD_SIZE, NODE_RANK, LOCAL_RANK, node and GPU, and
# the SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID and SLURM_NODEID of its task under srun;
# tests/gr_example's store and barriers work across the nodes; --wait streams every rank's
# lines and exits 0; logs (merged and one rank), status (text, --json, the list) after the
# end; logs -f and status --watch of a job while it runs; a stale dir of an earlier cluster's
# job of the same id is kept aside.
# timeout: 120
# lane: side
set -euo pipefail
# shellcheck source=slurm_client_common.sh
. "$(dirname "$0")/slurm_client_common.sh" tests/gr_example
example=$GRS_BUILD/tests/gr_example

# Job ids start at 1 again on this fresh cluster: dirs left by another cluster's jobs.
for i in 1 2 3; do
    mkdir -p "$GPURUN_JOBS/$i" && echo old >"$GPURUN_JOBS/$i/stale"
done

t0=$(grs_now_ms)
# shellcheck disable=SC2016 # expanded by each rank
run wait.out wait.err --wait -N 2 --gpus-per-node 2 -J envcheck -- sh -c \
    'echo "env $RANK $WORLD_SIZE $NODE_RANK $LOCAL_RANK $(hostname) $CUDA_VISIBLE_DEVICES"
     echo "slurm $SLURM_PROCID $SLURM_NTASKS $SLURM_LOCALID $SLURM_NODEID"; exec "$0" --steps 3' \
    "$example"
echo "# wait_ms=$(($(grs_now_ms) - t0))"
expect_rc "gpurun --wait" 0
id=$(job_id wait.out)
[[ $id =~ ^[123]$ ]] || grs_fail "the first job of a fresh cluster is '$id'"
# Every rank sees its node's whole allocation, as under torchrun: LOCAL_RANK picks one.
for r in 0 1 2 3; do
    node=$((r / 2))
    grep -qxF "[$r] env $r 4 $node $((r % 2)) node$((node + 1)) 0,1" wait.out ||
        grs_fail "--wait output lacks rank $r's environment line: $(grep "^\[$r\]" wait.out)"
    grep -qxF "[$r] slurm $r 4 $((r % 2)) $node" wait.out ||
        grs_fail "--wait output lacks rank $r's Slurm task line: $(grep "^\[$r\] slurm" wait.out)"
    grep -qxF "[$r] rank $r/4 local $((r % 2)) node $node: store ok, barrier ok" wait.out ||
        grs_fail "--wait output lacks rank $r's store and barrier line"
done
dir=$GPURUN_JOBS/$id
stale=("$GPURUN_JOBS/$id".*)
[ -f "${stale[0]}/stale" ] || grs_fail "the stale job dir $id was not kept aside"
[ ! -e "$dir/stale" ] || grs_fail "job $id reused a stale job dir"
for f in key job.json job.sbatch endpoint.json summary.json logs/rank-3.log; do
    [ -e "$dir/$f" ] || grs_fail "the job dir lacks $f"
done
[ "$(stat -c %a "$dir") $(stat -c %a "$dir/key")" = "700 600" ] ||
    grs_fail "job dir or key not private: $(stat -c '%a %n' "$dir" "$dir/key")"
grep -qF "\"job_id\": \"$id\"" "$dir/job.json" || grs_fail "job.json lacks the job id $id"

# --gpu-bind=single: one GPU each, the LOCAL_RANK-th of the node's allocation.
# shellcheck disable=SC2016 # expanded by each rank
run bind.out bind.err --wait -N 2 --gpus-per-node 2 --gpu-bind=single -- sh -c \
    'echo "gpu $RANK $CUDA_VISIBLE_DEVICES"'
expect_rc "gpurun --wait --gpu-bind=single" 0
for r in 0 1 2 3; do
    grep -qxF "[$r] gpu $r $((r % 2))" bind.out ||
        grs_fail "--gpu-bind=single: rank $r's line: $(grep "^\[$r\] gpu" bind.out)"
done

# logs: every rank, labelled; one rank as written.
run logs.out logs.err logs "$id"
expect_rc "gpurun logs" 0
for r in 0 1 2 3; do
    grep -q "^\[$r\] rank $r/4 " logs.out || grs_fail "logs lack rank $r"
done
run logs2.out logs2.err logs "$id" --rank 2
expect_rc "gpurun logs --rank 2" 0
head -n 1 logs2.out | grep -qxF "env 2 4 1 0 node2 0,1" || grs_fail "logs --rank 2: $(head -n 1 logs2.out)"

# status: COMPLETED, the nodes, the summary.
run st.json st.err status "$id" --json
expect_rc "gpurun status --json" 0
[ "$(json st.json 'v["state"], v["slurm"]["state"], v["exit_status"], v["ended"]')" = \
    "('COMPLETED', 'COMPLETED', 0, True)" ] || grs_fail "status --json: $(head -c 600 st.json)"
[ "$(json st.json 'v["slurm"]["nodes"], v["summary"]["outcome"], v["slurm"]["name"]')" = \
    "(['node1', 'node2'], 'completed', 'envcheck')" ] || grs_fail "status --json: nodes or outcome"
[ "$(json st.json 'v["progress"]["exited"], v["progress"]["step_max"]')" = "(4, 2)" ] ||
    grs_fail "status --json progress: $(json st.json 'v["progress"]')"
run st.txt st.err status "$id"
expect_rc "gpurun status" 0
grep -qxF "state: COMPLETED, exit status 0" st.txt || grs_fail "status text: $(head -n 3 st.txt)"
grep -qxF "nodes: node[1-2] (2)" st.txt || grs_fail "status text lacks the nodes"
run list.txt list.err status
expect_rc "gpurun status (the list)" 0
grep -qE "^$id +envcheck +COMPLETED +2 " list.txt || grs_fail "the job list: $(cat list.txt)"

# A job that runs a while: logs -f follows it to its end, status --watch too.
# shellcheck disable=SC2016 # expanded by each rank
run sub.out sub.err -N 2 --gpus-per-node 2 -- sh -c 'echo "a $RANK"; sleep 2; echo "b $RANK"'
expect_rc "gpurun (no --wait)" 0
id2=$(job_id sub.out)
t0=$(grs_now_ms)
timeout 30 "$gpurun" logs -f "$id2" >follow.out 2>follow.err ||
    grs_fail "logs -f exited with status $?: $(tail -n 2 follow.err)"
echo "# follow_ms=$(($(grs_now_ms) - t0))"
for r in 0 1 2 3; do
    grep -qxF "[$r] b $r" follow.out || grs_fail "logs -f lacks rank $r's last line: $(cat follow.out)"
done
timeout 30 "$gpurun" status --watch --json "$id2" >watch.out 2>watch.err ||
    grs_fail "status --watch exited with status $?"
tail -n 1 watch.out >watch.last
[ "$(json watch.last 'v["state"], v["ended"]')" = "('COMPLETED', True)" ] ||
    grs_fail "status --watch's last view: $(head -c 300 watch.last)"
echo "# a 2x2 job: environment, store, barrier, --wait, logs, status and follow ok"
