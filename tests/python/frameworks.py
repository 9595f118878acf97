"""Rank programs of tests/integ/python_frameworks.sh: a tiny model trained by PyTorch
Lightning or by the Hugging Face Trainer on CPUs (gloo), with gpurun's callback, until the
pre-timeout signal stops it. Each rank prints its last line: the step it stopped at and the
checkpoint it left.

usage: frameworks.py lightning|hf OUT_DIR

Each training step sleeps STEP_S, so that the run is still going when the test has read the
reports and sends the signal; MAX_STEPS bounds a run the signal never reaches."""

import importlib.abc
import importlib.util
import os
import sys
import time

STEP_S = 0.05
MAX_STEPS = 1000
LR = 0.05


def torch_311_compat():
    """Debian 12's torch 1.13 under Python 3.11: torch.distributed.fsdp (imported by
    Lightning) fails to import, a dataclass field with a default that 3.11 calls mutable
    (torch 2.0 made it a default_factory). The same fix, made as that one module is loaded;
    nothing else of torch is touched."""
    name = "torch.distributed._shard.sharded_tensor.metadata"
    old, new = "field(default=TensorProperties())", "field(default_factory=TensorProperties)"

    class Fix(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def find_spec(self, fullname, path, target=None):
            if fullname != name:
                return None
            sys.meta_path.remove(self)
            try:
                spec = importlib.util.find_spec(fullname)
            finally:
                sys.meta_path.insert(0, self)
            if spec is None or not spec.origin:
                return None
            with open(spec.origin) as f:
                self.source = f.read()
            if old not in self.source:
                return None
            return importlib.util.spec_from_file_location(fullname, spec.origin, loader=self)

        def create_module(self, spec):
            return None

        def exec_module(self, module):
            code = compile(self.source.replace(old, new), module.__spec__.origin, "exec")
            exec(code, module.__dict__)

    if sys.version_info >= (3, 11):
        sys.meta_path.insert(0, Fix())


def torch_release_version(torch):
    """Debian 12 builds torch 1.13.0's release as version "1.13.0a0", a pre-release to
    version checks: Lightning then takes torch for 1.12 and calls 1.13's API the old way
    (a TypeError on a weakref). Its release number is what the frameworks must see."""
    v = str(torch.__version__)
    if v.endswith("a0") and v.count(".") == 2:
        torch.__version__ = v[:-2]


def dataset(torch):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 8, generator=g)
    y = x @ torch.arange(1.0, 9.0).unsqueeze(1)
    return x, y


def lightning(out):
    torch_311_compat()
    import torch
    torch_release_version(torch)
    try:
        import lightning.pytorch as pl
    except ImportError:
        import pytorch_lightning as pl
    from gpurun.lightning import GpurunCallback
    import gpurun

    class Tiny(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 1)

        def training_step(self, batch, batch_idx):
            time.sleep(STEP_S)
            x, y = batch
            return torch.nn.functional.mse_loss(self.lin(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=LR)

    x, y = dataset(torch)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=4)
    ckpt = os.path.join(out, "preempted.ckpt")
    cb = GpurunCallback(ckpt_path=ckpt)
    trainer = pl.Trainer(accelerator="cpu", devices=gpurun.local_world_size(),
                         num_nodes=gpurun.world_size() // gpurun.local_world_size(),
                         strategy="ddp", max_steps=MAX_STEPS, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=[cb])
    trainer.fit(Tiny(), loader)
    print("lightning %s rank %d: stopped at step %s of %d, preempt_requested %s, checkpoint %s"
          % (pl.__version__, gpurun.rank(), cb.preempted_at, MAX_STEPS,
             gpurun.preempt_requested(), "saved" if os.path.exists(ckpt) else "missing"),
          flush=True)


def hf(out):
    import torch
    import transformers
    from transformers import Trainer, TrainingArguments
    from gpurun.hf import GpurunTrainerCallback
    import gpurun

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 1)

        def forward(self, x, labels):
            time.sleep(STEP_S)
            return {"loss": torch.nn.functional.mse_loss(self.lin(x), labels)}

    x, y = dataset(torch)
    data = [{"x": x[i], "labels": y[i]} for i in range(len(x))]
    args = TrainingArguments(output_dir=out, max_steps=MAX_STEPS, per_device_train_batch_size=4,
                             learning_rate=LR, lr_scheduler_type="constant", logging_steps=1,
                             save_strategy="no", report_to=[], no_cuda=True,
                             disable_tqdm=True, dataloader_num_workers=0)
    cb = GpurunTrainerCallback()
    trainer = Trainer(model=Tiny(), args=args, train_dataset=data, callbacks=[cb])
    trainer.train()
    saved = sorted(d for d in os.listdir(out) if d.startswith("checkpoint-"))
    print("hf %s rank %d: stopped at step %s of %d, preempt_requested %s, checkpoint %s"
          % (transformers.__version__, gpurun.rank(), cb.preempted_at, MAX_STEPS,
             gpurun.preempt_requested(), saved[-1] if saved else "missing"), flush=True)
    # Out without the interpreter's teardown: there torch 1.13's destructors race the
    # Trainer's gloo threads, and a run once aborted ("terminate called without an active
    # exception", SIGABRT) after training had finished; destroy_process_group() first hung
    # instead (a stop mid-epoch leaves DDP's last bucket in flight).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("lightning", "hf"):
        print("usage: frameworks.py lightning|hf OUT_DIR", file=sys.stderr)
        sys.exit(2)
    {"lightning": lightning, "hf": hf}[sys.argv[1]](sys.argv[2])
