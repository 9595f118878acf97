"""One rank of tests/integ/horovod_*.sh: horovodrun's contract, checked with horovod's own code.

The rank compares every HOROVOD_* variable gpurun gave it with what horovodrun's gloo_run
sets for the same layout (get_host_assignments, create_slot_env_vars, create_run_env_vars),
then uses horovod's HTTP client (put_data_into_kvstore, read_data_from_kvstore) against the
leader's rendezvous: every rank publishes its view, reads every other rank's, and takes part
in the three scopes horovod's gloo context uses ("global", "local_" + HOROVOD_HOSTNAME,
"cross_" + local rank) with DELETE as http_store.cc's Finalize sends it: a scope's keys must
stay until its last member finished, then go. Horovod's files come from the test (PyPI's
horovod 0.28.1) on PYTHONPATH; this script holds none of horovod's code.

usage: horovod_rendezvous.py --hosts node0:2,node1:2 --addr ADDR --iface IFACE --gloo-run PATH
"""
import argparse
import ast
import os
import sys
import time
import urllib.error
import urllib.request

from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
from horovod.runner.http.http_client import put_data_into_kvstore, read_data_from_kvstore

# How long a rank waits for the others at each step: they all start within a second.
WAIT_S = 60


def gloo_run_functions(path):
    """gloo_run's create_slot_env_vars and create_run_env_vars, taken from its source: importing
    the module would import all of horovodrun (ssh, the elastic driver...)."""
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    wanted = ("create_slot_env_vars", "create_run_env_vars")
    body = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in wanted]
    ns = {}
    exec(compile(ast.Module(body=body, type_ignores=[]), path, "exec"), ns)
    return ns["create_slot_env_vars"], ns["create_run_env_vars"]


def fail(rank, what):
    print(f"horovod rank {rank}: FAIL {what}", flush=True)
    sys.exit(1)


class Rendezvous:
    """The leader's horovod server, through horovod's own client (and urllib for DELETE, which
    horovod's Python client does not have; its C++ client sends the same request)."""

    def __init__(self, rank, addr, port):
        self.rank, self.addr, self.port = rank, addr, port

    def put(self, scope, key, value):
        put_data_into_kvstore(self.addr, self.port, scope, key, value)

    def get(self, scope, key):
        """The value, or None for a 404; anything else fails the rank."""
        try:
            return read_data_from_kvstore(self.addr, self.port, scope, key)
        except RuntimeError as e:
            cause = e.args[1] if len(e.args) > 1 else None
            if isinstance(cause, urllib.error.HTTPError) and cause.code == 404:
                return None
            fail(self.rank, f"GET /{scope}/{key}: {e!r}")

    def wait(self, scope, key):
        deadline = time.monotonic() + WAIT_S
        while True:
            v = self.get(scope, key)
            if v is not None:
                return v
            if time.monotonic() > deadline:
                fail(self.rank, f"/{scope}/{key} did not appear in {WAIT_S} s")
            time.sleep(0.02)

    def delete(self, scope, key):
        url = f"http://{self.addr}:{self.port}/{scope}/{key}"
        with urllib.request.urlopen(urllib.request.Request(url, method="DELETE")) as r:
            if r.status != 200:
                fail(self.rank, f"DELETE /{scope}/{key}: status {r.status}")

    def barrier(self, name, size):
        self.put("barrier_" + name, str(self.rank), True)
        for r in range(size):
            self.wait("barrier_" + name, str(r))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts", required=True, help="horovodrun's -H for the same layout")
    ap.add_argument("--addr", required=True, help="the rendezvous address gloo_run would use")
    ap.add_argument("--iface", required=True, help="the interface gloo_run would name")
    ap.add_argument("--gloo-run", required=True, help="horovod's runner/gloo_run.py")
    args = ap.parse_args()
    env = os.environ
    rank = int(env["RANK"])
    size = int(env["WORLD_SIZE"])
    slot_env, run_env = gloo_run_functions(args.gloo_run)

    # What horovodrun would give this rank: gloo_run's two functions for its slot.
    slots = get_host_assignments(parse_hosts(args.hosts), size)
    slot = slots[rank]
    port = env.get("HOROVOD_GLOO_RENDEZVOUS_PORT", "")
    if not port.isdigit():
        fail(rank, f"HOROVOD_GLOO_RENDEZVOUS_PORT is '{port}', not a port")
    want = {k: str(v) for k, v in slot_env(slot).items()}
    want.update({k: str(v) for k, v in run_env(args.addr, [args.iface], int(port)).items()})
    # gpurun leaves NCCL's interface to NCCL, as torchrun does (daemon/rankenv.c).
    want.pop("NCCL_SOCKET_IFNAME")
    got = {k: v for k, v in env.items() if k.startswith("HOROVOD_")}
    bad = [f"{k}: want '{want.get(k)}', got '{got.get(k)}'"
           for k in sorted(set(want) | set(got)) if want.get(k) != got.get(k)]
    for line in bad:
        print(f"horovod rank {rank}: {line}", flush=True)
    if bad:
        fail(rank, f"{len(bad)} HOROVOD_* variables differ from gloo_run's")

    # Every rank's view, through the leader.
    rdv = Rendezvous(rank, env["HOROVOD_GLOO_RENDEZVOUS_ADDR"], int(port))
    rdv.put("gpurun_test", str(rank), {"rank": rank, "env": got})
    for r in range(size):
        v = rdv.wait("gpurun_test", str(r))
        if v["rank"] != r or v["env"]["HOROVOD_RANK"] != str(r):
            fail(rank, f"rank {r}'s value is {v!r}")
        if v["env"]["HOROVOD_GLOO_RENDEZVOUS_PORT"] != port:
            fail(rank, f"rank {r} was told another server: {v!r}")
        if v["env"]["HOROVOD_HOSTNAME"] != slots[r].hostname:
            fail(rank, f"rank {r} has HOROVOD_HOSTNAME {v['env']['HOROVOD_HOSTNAME']}")

    # The three scopes of gloo_context.cc, this rank's member key in each, their sizes from
    # the layout: (scope, my key, member keys).
    local_rank, cross_rank = slot.local_rank, slot.cross_rank
    scopes = [
        ("global", rank, range(size)),
        ("local_" + env["HOROVOD_HOSTNAME"], local_rank, range(slot.local_size)),
        ("cross_" + str(local_rank), cross_rank, range(slot.cross_size)),
    ]
    for scope, me, _ in scopes:
        rdv.put(scope, str(me), f"{scope}/{me}")
    rdv.barrier("put", size)
    # Every member but a scope's last one finishes: nothing may go yet (an ad-hoc scope, a
    # name the leader does not know, would lose each finished member's key).
    for scope, me, members in scopes:
        if me != members[-1]:
            rdv.delete(scope, str(me))
    rdv.barrier("most_finished", size)
    for scope, _, members in scopes:
        for m in members:
            if rdv.get(scope, str(m)) != f"{scope}/{m}":
                fail(rank, f"/{scope}/{m} gone before the scope's last member finished")
    rdv.barrier("checked", size)
    for scope, me, members in scopes:
        if me == members[-1]:
            rdv.delete(scope, str(me))
    rdv.barrier("all_finished", size)
    for scope, _, members in scopes:
        for m in members:
            if rdv.get(scope, str(m)) is not None:
                fail(rank, f"/{scope}/{m} still there after every member finished")
    print(f"horovod rank {rank}/{size}: {len(want)} HOROVOD_* variables as gloo_run's, "
          f"kv ok, scopes ok", flush=True)


if __name__ == "__main__":
    main()
