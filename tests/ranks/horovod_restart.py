"""One rank of tests/integ/horovod_rendezvous.sh's restart job: a new generation must find the
leader's horovod store empty (gloo's addresses of the last generation's ranks are stale).

Generation 0 (GPURUN_RESTART_COUNT=0): every rank stores keys in a layout scope ("global") and
an ad-hoc one through horovod's HTTP client, waits until every rank has, and rank 0 fails.
Generation 1: every rank reads them back and must get 404 for each, from the same server.
"""
import os
import sys
import time
import urllib.error

from horovod.runner.http.http_client import put_data_into_kvstore, read_data_from_kvstore

WAIT_S = 60


def get(addr, port, scope, key):
    """The value, or None for a 404."""
    try:
        return read_data_from_kvstore(addr, port, scope, key)
    except RuntimeError as e:
        cause = e.args[1] if len(e.args) > 1 else None
        if isinstance(cause, urllib.error.HTTPError) and cause.code == 404:
            return None
        raise


def main():
    env = os.environ
    rank, size = int(env["RANK"]), int(env["WORLD_SIZE"])
    gen = int(env["GPURUN_RESTART_COUNT"])
    addr, port = env["HOROVOD_GLOO_RENDEZVOUS_ADDR"], int(env["HOROVOD_GLOO_RENDEZVOUS_PORT"])
    if gen == 0:
        put_data_into_kvstore(addr, port, "global", str(rank), f"gen0 rank {rank}")
        put_data_into_kvstore(addr, port, "gen0", str(rank), port)
        deadline = time.monotonic() + WAIT_S
        while any(get(addr, port, "gen0", str(r)) is None for r in range(size)):
            if time.monotonic() > deadline:
                print(f"horovod rank {rank}: FAIL the other ranks' keys never came", flush=True)
                sys.exit(1)
            time.sleep(0.02)
        print(f"horovod rank {rank} gen 0: stored", flush=True)
        # Rank 0 fails only once every rank has said so: its failure tears the others down.
        put_data_into_kvstore(addr, port, "said", str(rank), "1")
        if rank == 0:
            while any(get(addr, port, "said", str(r)) is None for r in range(size)):
                if time.monotonic() > deadline:
                    print("horovod rank 0: FAIL the other ranks never said 'stored'", flush=True)
                    sys.exit(1)
                time.sleep(0.02)
            sys.exit(3)
        time.sleep(WAIT_S)
        sys.exit(1)
    left = [f"/{s}/{r}" for s in ("global", "gen0", "said") for r in range(size)
            if get(addr, port, s, str(r)) is not None]
    if left:
        print(f"horovod rank {rank}: FAIL generation {gen} still finds {left}", flush=True)
        sys.exit(1)
    print(f"horovod rank {rank} gen {gen}: store empty", flush=True)


if __name__ == "__main__":
    main()
