"""An unmodified torch.distributed program: gloo through init_method="env://", one all_reduce
checked against its known sum, a barrier. It reads nothing of gpurun's own, so it passing
under `gpurun --local` shows that the environment rendezvousd gives ranks is what torch
expects (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)."""

import os
import sys

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo", init_method="env://")
    rank = dist.get_rank()
    world = dist.get_world_size()
    if rank != int(os.environ["RANK"]) or world != int(os.environ["WORLD_SIZE"]):
        print(f"rank {rank}/{world}: torch disagrees with RANK={os.environ['RANK']} "
              f"WORLD_SIZE={os.environ['WORLD_SIZE']}", flush=True)
        return 1

    # Every rank contributes rank+1 in each element: the sum is world*(world+1)/2.
    t = torch.full((4,), float(rank + 1))
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    want = world * (world + 1) / 2
    if not torch.equal(t, torch.full((4,), want)):
        print(f"rank {rank}/{world}: all_reduce gave {t.tolist()}, want {want}", flush=True)
        return 1
    dist.barrier()
    dist.destroy_process_group()
    print(f"torch rank {rank}/{world} all_reduce {want:g} ok, barrier ok", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
