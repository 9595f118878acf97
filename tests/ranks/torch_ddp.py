"""A plain torch DDP rank (gloo, init_method="env://") that reports its progress through the
gpurun Python module, for the torch_ddp integration test.

usage: torch_ddp.py [--backend gloo|nccl] [--steps N] [--step-ms MS]
                    [--stall-rank R --stall-step K] [--preempt]
With --backend nccl each rank takes the GPU of its LOCAL_RANK (the GPU checks' user job).
Rank R stops for good at step K after that step's allreduce and before its report, as a
rank stuck in its data loader would: the other ranks report step K, then wait for it in
step K+1's allreduce. With --preempt the rank asks for the pre-timeout signal and, when it
comes, writes a checkpoint file into GPURUN_JOB_DIR and exits 0.
"""
import argparse
import os
import time

import torch
import torch.distributed as dist

import gpurun


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--step-ms", type=int, default=50)
    ap.add_argument("--stall-rank", type=int, default=-1)
    ap.add_argument("--stall-step", type=int, default=-1)
    ap.add_argument("--preempt", action="store_true")
    ap.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    args = ap.parse_args()

    device = torch.device("cpu")
    if args.backend == "nccl":
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
    dist.init_process_group(args.backend, init_method="env://")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Linear(16, 1).to(device), device_ids=[device.index] if device.index is not None else None)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    if args.preempt:
        gpurun.on_preempt(lambda sig: print(f"rank {rank}: pre-timeout signal {sig}", flush=True))
    print(f"rank {rank} of {dist.get_world_size()} up", flush=True)
    for step in range(1, args.steps + 1):
        x = torch.randn(32, 16, device=device)
        loss = (model(x) ** 2).mean()
        opt.zero_grad()
        loss.backward()  # the allreduce: every rank meets here
        opt.step()
        if rank == args.stall_rank and step == args.stall_step:
            print(f"rank {rank} stalls at step {step}", flush=True)
            while True:
                time.sleep(3600)
        gpurun.report(step, loss=loss.item(), lr=0.01, tokens_per_s=32 / (args.step_ms / 1000),
                      total_steps=args.steps)
        # The ranks agree before they stop: one that left alone would hang the others in the
        # next allreduce.
        stop = torch.tensor([1 if gpurun.preempt_requested() else 0], device=device)
        if args.preempt:
            dist.all_reduce(stop, op=dist.ReduceOp.MAX)
        if stop.item():
            path = os.path.join(os.environ["GPURUN_JOB_DIR"], f"ckpt-{rank}.pt")
            torch.save({"step": step, "model": model.state_dict()}, path)
            print(f"rank {rank}: checkpoint at step {step}", flush=True)
            dist.destroy_process_group()
            return 0
        time.sleep(args.step_ms / 1000)
    dist.barrier()
    print(f"rank {rank} done", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
