"""Rank programs of the frameworks lane (tests/integ/fw_*.sh): the same tiny regression
trained for STEPS steps by a real framework under gpurun, written the way the framework's own
guides write it, with nothing of gpurun in it. Each rank prints one line at the end:

    lane NAME rank R/W local L/LW threads T steps S loss X params H

W is the world the framework saw, T torch's intra-op threads (OMP_NUM_THREADS as gpurun set
it), X the rank's last loss and H a digest of every parameter's bytes: ranks that trained one
model together print the same H, in any layout of the same world (the data a rank trains on
depends on its global rank alone, and a sum of two numbers is the same in either order).

usage: lane.py lightning|accelerate|horovod|deepspeed OUT_DIR"""

import hashlib
import os
import sys

# fairseq's probe (tests/frameworks/fairseq_probe) imports the same helpers.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from frameworks import torch_311_compat, torch_release_version  # noqa: E402

STEPS = 8
BATCH = 4
LR = 0.05


def digest(params):
    h = hashlib.sha256()
    for p in params:
        h.update(p.detach().double().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def report(name, rank, world, local, local_world, loss, params, steps=STEPS):
    import torch
    print("lane %s rank %d/%d local %d/%d threads %d steps %d loss %.9g params %s"
          % (name, rank, world, local, local_world, torch.get_num_threads(), steps, loss,
             digest(params)), flush=True)


def data(torch):
    """64 samples of y = x . (1..8): every rank builds the same set."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 8, generator=g)
    return x, x @ torch.arange(1.0, 9.0).unsqueeze(1)


def lightning(out):
    torch_311_compat()
    import torch
    torch_release_version(torch)
    import pytorch_lightning as pl

    class Tiny(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 1)
            self.last = float("nan")

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.lin(x), y)
            self.last = loss.item()
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=LR)

    pl.seed_everything(0)
    x, y = data(torch)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y),
                                         batch_size=BATCH)
    # A Lightning guide's multi-node Trainer: GPUs of a node and the nodes, as the launcher
    # was told them.
    nodes = int(os.environ["GROUP_WORLD_SIZE"])
    devices = int(os.environ["LOCAL_WORLD_SIZE"])
    trainer = pl.Trainer(accelerator="cpu", devices=devices, num_nodes=nodes, strategy="ddp",
                         max_steps=STEPS, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         default_root_dir=out)
    model = Tiny()
    trainer.fit(model, loader)
    report("lightning", trainer.global_rank, trainer.world_size, trainer.local_rank,
           devices, model.last, model.parameters(), trainer.global_step)


def accelerate(out):
    import torch
    from accelerate import Accelerator
    from accelerate.utils import set_seed

    acc = Accelerator(cpu=True)
    set_seed(0)
    x, y = data(torch)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y),
                                         batch_size=BATCH)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    model, opt, loader = acc.prepare(model, opt, loader)
    step, last = 0, float("nan")
    while step < STEPS:
        for xb, yb in loader:
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(xb), yb)
            acc.backward(loss)
            opt.step()
            last, step = loss.item(), step + 1
            if step == STEPS:
                break
    st = acc.state
    report("accelerate", st.process_index, st.num_processes, st.local_process_index,
           int(os.environ.get("LOCAL_WORLD_SIZE", "0")), last, acc.unwrap_model(model).parameters())


def horovod(out):
    import torch
    import horovod.torch as hvd

    hvd.init()
    torch.manual_seed(hvd.rank() + 1)  # each rank its own start: the broadcast must align them
    x, y = data(torch)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=LR * hvd.size())
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    # horovod's examples shard the data by rank with a DistributedSampler.
    sampler = torch.utils.data.distributed.DistributedSampler(
        torch.utils.data.TensorDataset(x, y), num_replicas=hvd.size(), rank=hvd.rank(),
        shuffle=False)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y),
                                         batch_size=BATCH, sampler=sampler)
    step, last = 0, float("nan")
    while step < STEPS:
        for xb, yb in loader:
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(xb), yb)
            loss.backward()
            opt.step()
            last, step = loss.item(), step + 1
            if step == STEPS:
                break
    report("horovod", hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size(), last,
           model.parameters())
    hvd.shutdown()


def deepspeed(out):
    """DeepSpeed ZeRO stage 2 through the Hugging Face Trainer on CPUs (DS_ACCELERATOR=cpu),
    written as an HPC guide writes its ds_gpt2.py for `mpirun -np N python3 ds_gpt2.py`: the
    rank takes its place from Open MPI's variables, which gpurun sets as mpirun would."""
    import torch
    import deepspeed as ds
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments, set_seed

    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    world = int(os.environ["OMPI_COMM_WORLD_SIZE"])
    local = int(os.environ["OMPI_COMM_WORLD_LOCAL_RANK"])
    local_world = int(os.environ["OMPI_COMM_WORLD_LOCAL_SIZE"])
    vocab, seq, samples = 64, 16, 64

    class Counting(torch.utils.data.Dataset):
        """Token runs counting up from a random start, the same on every rank: the
        Trainer's sampler gives each rank its share."""

        def __init__(self):
            g = torch.Generator().manual_seed(0)
            self.ids = (torch.randint(0, vocab, (samples, 1), generator=g)
                        + torch.arange(seq)) % vocab

        def __len__(self):
            return samples

        def __getitem__(self, i):
            return {"input_ids": self.ids[i], "labels": self.ids[i]}

    set_seed(0)
    # No "optimizer" section: DeepSpeed's own Adams are compiled ops; the Trainer's AdamW
    # runs under ZeRO as it is.
    config = {"train_micro_batch_size_per_gpu": "auto", "train_batch_size": "auto",
              "gradient_accumulation_steps": "auto", "gradient_clipping": "auto",
              "zero_optimization": {"stage": 2, "allgather_partitions": True,
                                    "reduce_scatter": True, "overlap_comm": False,
                                    "contiguous_gradients": True},
              "steps_per_print": 1000}
    args = TrainingArguments(output_dir=out, no_cuda=True, deepspeed=config, local_rank=local,
                             per_device_train_batch_size=BATCH, max_steps=STEPS,
                             learning_rate=1e-3, optim="adamw_torch",
                             # dividing max_steps: the run's mean loss is then every rank's
                             logging_steps=STEPS // 2, save_strategy="no", report_to=[],
                             seed=0, dataloader_num_workers=0, disable_tqdm=True)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=vocab, n_positions=seq, n_embd=32,
                                       n_layer=2, n_head=2))
    trainer = Trainer(model=model, args=args, train_dataset=Counting())
    result = trainer.train()
    engine = trainer.model_wrapped
    if type(engine).__name__ != "DeepSpeedEngine" or engine.zero_optimization_stage() != 2:
        sys.exit("deepspeed %s: the Trainer ran %s, not DeepSpeed's ZeRO-2 engine"
                 % (ds.__version__, type(engine).__name__))
    if (args.process_index, args.world_size) != (rank, world):
        sys.exit("deepspeed: the Trainer's rank %d of %d, Open MPI's %d of %d"
                 % (args.process_index, args.world_size, rank, world))
    report("deepspeed", args.process_index, args.world_size, local, local_world,
           result.training_loss, engine.module.parameters(), trainer.state.global_step)
    # The group's end, together: torch 1.13's gloo aborts a process ("terminate called
    # without an active exception") whose peer left while its group still stood.
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


LANES = {"lightning": lightning, "accelerate": accelerate, "horovod": horovod,
         "deepspeed": deepspeed}

if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in LANES:
        print("usage: lane.py %s OUT_DIR" % "|".join(LANES), file=sys.stderr)
        sys.exit(2)
    LANES[sys.argv[1]](sys.argv[2])
