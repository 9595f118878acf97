#!/bin/bash
# Horovod without horovodrun across nodes: two nodes in their own network namespaces (one
# rendezvousd each, named node0 and node1, two ranks per node). Every rank checks its HOROVOD_*
# variables against gloo_run's for -H node0:2,node1:2 with the rendezvous at node 0's address
# and HOROVOD_GLOO_IFACE the namespace's own interface (eth0, its end of the veth), and uses
# horovod's HTTP client across the bridge (tests/ranks/horovod_rendezvous.py): job.json says
# "horovod": 1, and node 1's ranks are served as one of the job's hosts. Horovod's code comes
# from PyPI at test time; skips when PyPI cannot be reached or namespaces cannot be made.
# timeout: 300
# lane: side
set -euo pipefail
# shellcheck source=prologue.sh
. "$(dirname "$0")/prologue.sh"
# shellcheck source=tests/netns.sh disable=SC1091
. "$(dirname "$0")/../netns.sh"
# shellcheck source=horovod_common.sh
. "$(dirname "$0")/horovod_common.sh"

NODES=2
NPROCS=2
WORLD=$((NODES * NPROCS))
python=${HOROVOD_TEST_PYTHON:-/usr/bin/python3}
[ -x "$python" ] || skip "no '$python'"
netns_test_begin "$NODES" rendezvousd
job=$NETNS_WORK/job-hvd-$$

hvd_fetch "$python" "$NETNS_WORK/horovod"
export PYTHONPATH=$HVD_PYTHONPATH${PYTHONPATH:+:$PYTHONPATH}
unset HOROVOD_CONTROLLER HOROVOD_CPU_OPERATIONS HOROVOD_GLOO_IFACE

addr0=$(netns_addr 0)
netns_job_write "$job" "$NODES" "$NPROCS" '"join_timeout_ms": 20000, "kill_grace_ms": 1000, "horovod": 1' \
    "$python" "$root/tests/ranks/horovod_rendezvous.py" --hosts "node0:$NPROCS,node1:$NPROCS" \
    --addr "$addr0" --iface eth0 --gloo-run "$HVD_GLOO_RUN"
t0=$(netns_now_ms)
netns_job_start "$job" "$NETNS_WORK" "$NETNS_BUILD/rendezvousd"
for ((k = 0; k < NODES; k++)); do
    netns_wait "${NETNS_DAEMONS[k]}" 60000 || fail "node $k's rendezvousd still runs after 60 s"
    [ "$NETNS_STATUS" = 0 ] || fail "node $k's rendezvousd exited with status $NETNS_STATUS, not 0"
done
echo "# job_ms=$(($(netns_now_ms) - t0))"

for ((r = 0; r < WORLD; r++)); do
    k=$((r / NPROCS))
    line="[$r] horovod rank $r/$WORLD: 12 HOROVOD_* variables as gloo_run's, kv ok, scopes ok"
    grep -qxF "$line" "$NETNS_WORK/node$k.out" || fail "node $k's output lacks '$line'"
done
! grep -F 'horovod rendezvous' "$NETNS_WORK/node0.err" | grep -v ' info: ' ||
    fail "the leader logged a refusal"
echo "# $WORLD ranks on $NODES namespaced nodes: HOROVOD_* as gloo_run's (iface eth0), horovod's client ok"
