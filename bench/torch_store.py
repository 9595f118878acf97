"""The anchor of the rendezvous benchmark: torch's own TCPStore doing the same work as a
gpurun rendezvous. One TCPStore server; N clients (threads of this process, each with its
own connection, as each rank of a torchrun job has) connect, set their address, get a rank's
address on the next node (of 8 ranks), then meet in the store-based barrier torch uses
(add, and the last one sets a key all wait for).

    python3 bench/torch_store.py N     prints "N connected_ms store_ms barrier_ms"
"""
import datetime
import sys
import threading
import time

import torch.distributed as dist

PER_NODE = 8


def main():
    n = int(sys.argv[1])
    timeout = datetime.timedelta(seconds=60)
    server = dist.TCPStore("127.0.0.1", 0, None, True, timeout, wait_for_workers=False)
    port = server.port
    stamps = [None] * n
    errors = []
    go = threading.Barrier(n + 1)

    def client(r):
        try:
            go.wait()
            c = dist.TCPStore("127.0.0.1", port, None, False, timeout, wait_for_workers=False)
            t1 = time.perf_counter()
            c.set("addr/%d" % r, "127.0.0.1:%d" % (20000 + r))
            peer = (r + PER_NODE) % n
            v = c.get("addr/%d" % peer)
            if v != b"127.0.0.1:%d" % (20000 + peer):
                raise ValueError("wrong value for addr/%d: %r" % (peer, v))
            t2 = time.perf_counter()
            if c.add("barrier", 1) == n:
                c.set("barrier_done", "1")
            c.wait(["barrier_done"])
            stamps[r] = (t1, t2, time.perf_counter())
        except Exception as e:  # reported below, the run fails
            errors.append(repr(e))

    threads = [threading.Thread(target=client, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    t0 = time.perf_counter()
    go.wait()
    for t in threads:
        t.join()
    if errors:
        print("torch_store: %d clients failed: %s" % (len(errors), errors[0]), file=sys.stderr)
        sys.exit(1)

    def last(k):
        return (max(s[k] for s in stamps) - t0) * 1e3

    print("%d %.1f %.1f %.1f" % (n, last(0), last(1), last(2)))


main()
