#!/bin/bash
# Ranks in containers on the real Slurm test cluster: `gpurun -N 2 --gpus-per-node 2
# --container-image ... --wait` through libslurm runs every rank of the batch job inside the
# image (Podman, container_common.sh's set-up and image, the job's environment carrying the
# test's containers.conf and storage to the nodes), on the node Slurm gave it, with its
# Slurm task variables and gpurun's store and barriers working from inside; no container is
# left on any node. runc needs the nodes' cgroup hierarchies, which this cluster hides: the
# test mounts them in each node's namespace first.
# timeout: 180
# lane: side
set -euo pipefail
# shellcheck source=slurm_client_common.sh
. "$(dirname "$0")/slurm_client_common.sh"
skip() {
    echo "# SKIP $*"
    exit 77
}
fail() { grs_fail "$@"; }
# shellcheck source=container_common.sh
. "$here/container_common.sh"
# The cluster's own exit (grs_test_end) after the containers' clean-up, with the status.
container_exit() {
    local rc=$?
    container_clean
    set +e
    (exit "$rc")
    grs_test_end
}
trap container_exit EXIT
# runc makes every container's cgroups: nodes must see the cgroup hierarchies. This cluster's
# slurmd each run under an empty /sys/fs/cgroup of their own (tests/slurm/README.md: slurmd's
# cgroup plugin), so the test mounts the host's hierarchies in each node's mount namespace,
# as a node of a real cluster shows them, once the nodes are up.
for pid in $(pgrep -x slurmd); do
    # shellcheck disable=SC2016 # the node's shell expands its own
    nsenter -t "$pid" -m sh -c '
        for h in cpu cpuacct cpuset memory devices freezer blkio pids; do
            mkdir -p "/sys/fs/cgroup/$h"
            mount -t cgroup -o "$h" cgroup "/sys/fs/cgroup/$h" 2>/dev/null || true
        done
        mkdir -p /sys/fs/cgroup/systemd
        mount -t cgroup -o none,name=systemd cgroup /sys/fs/cgroup/systemd 2>/dev/null || true
        mkdir -p /sys/fs/cgroup/unified
        mount -t cgroup2 none /sys/fs/cgroup/unified 2>/dev/null || true' || true
done
# shellcheck disable=SC2016 # the node's shell tests it
if ! timeout 30 srun -N1 sh -c 'test -e /sys/fs/cgroup/cgroup.controllers ||
        test -e /sys/fs/cgroup/cpuset/cpuset.cpus' >/dev/null 2>&1; then
    skip "the test cluster's nodes show no cgroup hierarchy (an empty /sys/fs/cgroup," \
        "not mountable here): runc cannot make a container's cgroups there"
fi
mkdir -p "$GRS_WORK/ctr"
container_setup "$GRS_WORK/ctr"

cat >rank.py <<'EOF'
import os, socket
import gpurun
gpurun.set("host%d" % gpurun.rank(), socket.gethostname())
gpurun.barrier("hosts")
hosts = [gpurun.get("host%d" % r).decode() for r in range(gpurun.world_size())]
print("rank %s/%s local %s slurm %s node %s: %s; hosts %s" % (
    os.environ["RANK"], os.environ["WORLD_SIZE"], os.environ["LOCAL_RANK"],
    os.environ.get("SLURM_PROCID"), socket.gethostname(),
    open("/etc/gpurun-test-image").read().strip(), " ".join(hosts)), flush=True)
EOF
t0=$(grs_now_ms)
run out err --wait -N 2 --gpus-per-node 2 "${CONTAINER_ARGS[@]}" -- /usr/bin/python3 rank.py
echo "# slurm_container_ms=$(($(grs_now_ms) - t0))"
expect_rc "gpurun --wait with --container-image" 0
for r in 0 1 2 3; do
    node=node$((r / 2 + 1))
    grep -qxF "[$r] rank $r/4 local $((r % 2)) slurm $r node $node: gpurun test image; hosts node1 node1 node2 node2" out ||
        grs_fail "rank $r's line from inside the image on $node is missing: $(cat out err)"
done
left=$(podman ps --all --format '{{.Names}}')
[ -z "$left" ] || grs_fail "containers left: $left"
echo "# 2 nodes x 2 ranks in podman containers under Slurm: store and barrier across them, nothing left"
