#!/bin/bash
# The Slurm test cluster itself (tests/slurm/): up.sh brings three idle nodes; srun spreads
# tasks over two of them, each task on a node of its own name with the fake GPUs of its
# allocation in CUDA_VISIBLE_DEVICES; more GPUs than a node has are refused; a batch job runs
# an inner srun on two nodes; a command runs inside a node; up.sh again while a job runs
# starts clean; down.sh leaves nothing behind.
# timeout: 120
# lane: side
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/slurm/lib.sh
. "$here/../slurm/lib.sh"

t0=$(grs_now_ms)
# shellcheck disable=SC2119 # no program of the build is needed
grs_test_begin
echo "# up_ms=$(($(grs_now_ms) - t0))"
cd "$GRS_WORK"

# expect NAME WANT GOT: fails the test when GOT is not WANT.
expect() {
    [ "$2" = "$3" ] || grs_fail "$1: expected '$2', got '$3'"
}

# --- the nodes --------------------------------------------------------------------------------
[ "$GR_SLURM_NODES" -ge 3 ] || grs_fail "the test needs 3 nodes, the cluster has $GR_SLURM_NODES"
want_gpus=$GR_SLURM_GPUS
[ "$want_gpus" -ge 2 ] || grs_fail "the test needs 2 fake GPUs per node, the cluster has $want_gpus"
expect "idle nodes" "$GR_SLURM_NODE_NAMES" \
    "$(sinfo -h -N -t idle -o %N | sort -u | tr '\n' ' ' | sed 's/ $//')"
expect "node3's address" "$(grs_node_addr 3)" "$(scontrol show node node3 | sed -n 's/.*NodeAddr=\([^ ]*\).*/\1/p')"

# --- srun over two nodes, with GPUs -----------------------------------------------------------
# One line per task: rank, node id, hostname, the node Slurm ran it on, its GPUs.
t1=$(grs_now_ms)
# shellcheck disable=SC2016 # expanded by each task
timeout 60 srun -N2 --ntasks-per-node=2 --gpus-per-node=2 bash -c \
    'echo "$SLURM_PROCID $SLURM_NODEID $(hostname) $SLURMD_NODENAME ${CUDA_VISIBLE_DEVICES:-none}"' \
    >srun.out 2>srun.err || grs_fail "srun -N2 failed: $(tail -n 3 srun.err)"
echo "# srun_ms=$(($(grs_now_ms) - t1))"
expect "srun task lines" "0 0 node1 node1 0,1
1 0 node1 node1 0,1
2 1 node2 node2 0,1
3 1 node2 node2 0,1" "$(sort -n srun.out)"

all=$(seq -s, 0 $((want_gpus - 1)))
expect "all GPUs of a node" "$all" "$(timeout 60 srun -N1 --gpus-per-node="$want_gpus" printenv CUDA_VISIBLE_DEVICES)"
if timeout 60 srun -N1 --gpus-per-node=$((want_gpus + 1)) true >/dev/null 2>srun9.err; then
    grs_fail "srun --gpus-per-node=$((want_gpus + 1)) ran on nodes of $want_gpus GPUs"
fi
grep -q 'Requested node configuration is not available' srun9.err ||
    grs_fail "srun of too many GPUs failed otherwise: $(tail -n 1 srun9.err)"

# --- a batch job with an inner srun -----------------------------------------------------------
t1=$(grs_now_ms)
# shellcheck disable=SC2016 # expanded in the job
job=$(sbatch --parsable -N2 --gpus-per-node=1 -o batch-%j.out \
    --wrap 'srun bash -c "echo step \$(hostname) \$CUDA_VISIBLE_DEVICES"; echo batch $(hostname)')
state=$(grs_job_wait "$job" 60) || grs_fail "batch job $job did not end within 60 s"
echo "# sbatch_ms=$(($(grs_now_ms) - t1))"
expect "batch job $job state" COMPLETED "$state"
expect "batch job $job output" "batch node1
step node1 0
step node2 0" "$(sort "batch-$job.out")"

# --- a command inside node 2 ------------------------------------------------------------------
expect "hostname inside node 2" node2 "$("$here/../slurm/lib.sh" exec 2 hostname)"
expect "address inside node 2" "$(grs_node_addr 2)" \
    "$(grs_exec 2 ip -4 -o addr show dev eth0 | sed -n 's/.* inet \([0-9.]*\)\/.*/\1/p')"
if [ "$(grep -c "$GRS_HOSTS_TAG" /etc/hosts)" = "$GR_SLURM_NODES" ]; then
    expect "node1 in /etc/hosts" "$(grs_node_addr 1)" "$(getent hosts node1 | cut -d' ' -f1)"
fi

# --- up again while a job runs: a clean cluster, the job and its tasks gone ---------------------
job=$(sbatch --parsable -N1 -o /dev/null --wrap 'srun sleep 300')
sleepers=
for ((i = 0; i < 100; i++)); do
    for p in $(grs__ns_pids); do
        [ "$(cat "/proc/$p/comm" 2>/dev/null)" = sleep ] && sleepers+=" $p"
    done
    [ -n "$sleepers" ] && break
    sleep 0.1
done
[ -n "$sleepers" ] || grs_fail "no sleep task of job $job inside the nodes within 10 s"
t1=$(grs_now_ms)
"$here/../slurm/up.sh" >up2.out 2>&1 || grs_fail "up.sh on a running cluster failed: $(tail -n 3 up2.out)"
echo "# restart_ms=$(($(grs_now_ms) - t1))"
for p in $sleepers; do
    ! grs_alive "$p" || grs_fail "the sleep task $p of job $job survived the restart"
done
expect "jobs after the restart" "" "$(squeue -h -o %A)"
expect "idle nodes after the restart" "$GR_SLURM_NODES" "$(sinfo -h -N -t idle -o %N | sort -u | wc -l)"

# --- down leaves nothing ----------------------------------------------------------------------
pids=$(grs__ns_pids | sort -u | tr '\n' ' ')
[ -n "${pids// /}" ] || grs_fail "no daemon inside the cluster's namespaces while it is up"
t1=$(grs_now_ms)
"$here/../slurm/down.sh"
echo "# down_ms=$(($(grs_now_ms) - t1))"
for p in $pids; do
    ! grs_alive "$p" || grs_fail "process $p ($(cat "/proc/$p/comm" 2>/dev/null)) survived down.sh"
done
expect "namespaces after down" "" "$(grs__namespaces)"
ip link show "$GRS_HOST_VETH" >/dev/null 2>&1 && grs_fail "link '$GRS_HOST_VETH' survived down.sh"
expect "tagged /etc/hosts lines after down" 0 "$(grep -c "$GRS_HOSTS_TAG" /etc/hosts || true)"
"$here/../slurm/down.sh" || grs_fail "down.sh on a cluster that is down failed"
echo "# the cluster: up, srun, GPUs, sbatch, node exec, restart and down ok"
