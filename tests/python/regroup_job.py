"""A torch DDP job (gloo, CPU) under gpurun.inprocess.run, for tests/integ/fw_torch_regroup.sh.

    regroup_job.py STEPS [KILL_AT [RAISE_AT]]

Each rank trains a small MLP on data of its own that depends only on the step and the rank;
rank 0 prints "loss STEP VALUE" once a step's update is made, and every rank prints at each
call of the training function "start generation G step S call C pid P" and at the end
"regroup_job rank R steps S params DIGEST" (SHA-256 of the parameters and Adam's moments,
as raw float32). The test kills a node while it runs and compares with an undisturbed run;
with KILL_AT, rank 1 of generation 0 kills its own node's rendezvousd (the parent of its shim)
once step KILL_AT is done (-1: never); with RAISE_AT, rank 1 raises an error of its own (a
RuntimeError saying CUDA is out of memory) after step RAISE_AT, which gpurun.inprocess must not
take for a peer's loss.
"""

import hashlib
import os
import signal
import sys
import time

import torch
from torch.nn.parallel import DistributedDataParallel

import gpurun
import gpurun.inprocess as inprocess

steps = int(sys.argv[1])
kill_at = int(sys.argv[2]) if len(sys.argv) > 2 else -1
raise_at = int(sys.argv[3]) if len(sys.argv) > 3 else -1
torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
pos = {"step": 0, "calls": 0}
rank = gpurun.rank()


def batch(step):
    g = torch.Generator().manual_seed(step * 1000 + rank)
    x = torch.randn(16, 32, generator=g)
    return x, x.sum(1, keepdim=True).sin()


def digest():
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().numpy().tobytes())
    for st in opt.state_dict()["state"].values():
        for k in ("exp_avg", "exp_avg_sq"):
            h.update(st[k].numpy().tobytes())
    return h.hexdigest()[:16]


def train(generation):
    pos["calls"] += 1
    s = inprocess.share({"model": model.state_dict(), "opt": opt.state_dict(),
                         "step": pos["step"]})
    model.load_state_dict(s["model"])
    opt.load_state_dict(s["opt"])
    pos["step"] = s["step"]
    print("start generation %d step %d call %d pid %d" % (generation, pos["step"], pos["calls"],
                                                          os.getpid()), flush=True)
    ddp = DistributedDataParallel(model)
    while pos["step"] < steps:
        x, y = batch(pos["step"])
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        opt.step()
        pos["step"] += 1
        if rank == 0:
            print("loss %d %s" % (pos["step"], loss.item().hex()), flush=True)
        gpurun.report(pos["step"], loss=loss.item(), total_steps=steps)
        if rank == 1 and pos["step"] == raise_at:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB (a test's)")
        if rank == 1 and generation == 0 and pos["step"] == kill_at:
            with open("/proc/%d/stat" % os.getppid()) as f:
                daemon = int(f.read().rsplit(")", 1)[1].split()[1])
            print("killing node 1's daemon after step %d" % kill_at, flush=True)
            os.kill(daemon, signal.SIGKILL)
        time.sleep(0.005)
    return digest()


d = inprocess.run(train, backend="gloo")
print("regroup_job rank %d steps %d params %s" % (rank, pos["step"], d), flush=True)
