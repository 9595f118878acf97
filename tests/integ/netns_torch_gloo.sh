#!/bin/bash
# torch's gloo across nodes whose host names do not resolve to their addresses: two nodes in
# network namespaces (each daemon names itself nodeK, a name no resolver knows; the host's own
# name resolves to loopback), one rank on each, an unmodified torch.distributed gloo
# all_reduce. gloo binds the interface its host's name resolves to unless GLOO_SOCKET_IFNAME
# names one: rendezvousd must name the interface holding its node's address, or gloo falls
# back to loopback and the ranks cannot reach each other. Skips without Debian's python3-torch.
# timeout: 120
# lane: side
set -euo pipefail
# shellcheck source=tests/netns.sh disable=SC1091
. "$(dirname "$0")/../netns.sh"

python=${TORCH_PYTHON:-/usr/bin/python3}
NODES=2
netns_test_begin "$NODES" rendezvousd
[ -x "$python" ] || skip "no '$python'"
"$python" -c 'import importlib.util as u; assert u.find_spec("torch")' >/dev/null 2>&1 ||
    skip "'$python' has no torch (Debian's python3-torch)"
unset GLOO_SOCKET_IFNAME
job=$NETNS_WORK/job-tg-$$
cat >"$NETNS_WORK/rank.py" <<'PY'
import os
import torch
import torch.distributed as dist
print("GLOO_SOCKET_IFNAME=" + os.environ.get("GLOO_SOCKET_IFNAME", "(unset)"), flush=True)
dist.init_process_group("gloo", init_method="env://")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
print(f"rank {dist.get_rank()} sum {t.item():g}", flush=True)
dist.destroy_process_group()
PY
netns_job_write "$job" "$NODES" 1 "\"join_timeout_ms\": 30000, \"kill_grace_ms\": 1000" \
    "$python" "$NETNS_WORK/rank.py"
netns_job_start "$job" "$NETNS_WORK" "$NETNS_BUILD/rendezvousd"
for ((k = 0; k < NODES; k++)); do
    netns_wait "${NETNS_DAEMONS[k]}" 90000 || fail "node $k's rendezvousd still runs after 90 s"
    [ "$NETNS_STATUS" = 0 ] ||
        fail "node $k's rendezvousd exited $NETNS_STATUS: $(grep -h '^\[' "$NETNS_WORK"/node*.out | tail -n 4)"
done
for r in 0 1; do
    grep -qxF "[$r] rank $r sum 3" "$NETNS_WORK"/node*.out || fail "rank $r did not print the sum 3"
    grep -qxF "[$r] GLOO_SOCKET_IFNAME=eth0" "$NETNS_WORK"/node*.out ||
        fail "rank $r's GLOO_SOCKET_IFNAME: $(grep -h "^\[$r\] GLOO" "$NETNS_WORK"/node*.out)"
done
echo "# gloo across two namespaces on eth0, names unresolved: all_reduce summed 3"
