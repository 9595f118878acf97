"""One rank of tests/integ/horovod_torch.sh: real horovod (PyTorch, gloo controller) under gpurun,
launched without horovodrun. hvd.init() must find its place (rank, sizes, local and cross
ranks) as gpurun's environment gives it, rendezvous through the leader's HTTP store, and its
collectives must compute the right thing; then hvd.shutdown() and a second hvd.init(), whose
rendezvous reuses the same three scopes, which the leader must have cleared.
"""
import os
import sys

import horovod.torch as hvd
import torch


def fail(what):
    print(f"horovod torch rank {os.environ.get('RANK')}: FAIL {what}", flush=True)
    sys.exit(1)


def check_place():
    env = os.environ
    want = {
        "rank": int(env["RANK"]),
        "size": int(env["WORLD_SIZE"]),
        "local_rank": int(env["LOCAL_RANK"]),
        "local_size": int(env["LOCAL_WORLD_SIZE"]),
        "cross_rank": int(env["GROUP_RANK"]),
        "cross_size": int(env["GROUP_WORLD_SIZE"]),
    }
    got = {k: getattr(hvd, k)() for k in want}
    if got != want:
        fail(f"place {got}, not {want}")
    return want["rank"], want["size"]


def collectives(rank, size, round_):
    x = torch.tensor([float(rank + 1), float(round_)])
    total = hvd.allreduce(x, op=hvd.Sum, name=f"sum{round_}")
    want = torch.tensor([size * (size + 1) / 2.0, float(round_ * size)])
    if not torch.equal(total, want):
        fail(f"allreduce sum {total.tolist()}, not {want.tolist()}")
    avg = hvd.allreduce(torch.tensor([float(rank)]), name=f"avg{round_}")
    if abs(avg.item() - (size - 1) / 2.0) > 1e-6:
        fail(f"allreduce average {avg.item()}, not {(size - 1) / 2.0}")
    every = hvd.allgather(torch.tensor([rank]), name=f"gather{round_}")
    if every.tolist() != list(range(size)):
        fail(f"allgather {every.tolist()}")
    root = hvd.broadcast(torch.tensor([rank * 10 + round_]), root_rank=size - 1,
                         name=f"bcast{round_}")
    if root.item() != (size - 1) * 10 + round_:
        fail(f"broadcast {root.item()}")
    # The local and cross communicators (the "local_" and "cross_" scopes' contexts).
    hvd.barrier()


def main():
    for round_ in (1, 2):
        hvd.init()
        if not hvd.gloo_enabled():
            fail("horovod does not run its gloo controller")
        rank, size = check_place()
        collectives(rank, size, round_)
        hvd.shutdown()
    print(f"horovod torch rank {rank}/{size}: init, allreduce, allgather, broadcast ok, "
          f"twice", flush=True)


if __name__ == "__main__":
    main()
