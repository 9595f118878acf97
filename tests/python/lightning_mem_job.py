"""A rank of tests/integ/fw_lightning_mem.sh: PyTorch Lightning's DDP with gpurun's memory
checkpoints (gpurun.lightning.GpurunMemCheckpoint, one each training epoch). Each rank prints
at the end:

    memlane rank R/W steps S resumed P params H

P is the step its run resumed from (-1: none), H a digest of every parameter's bytes.

usage: lightning_mem_job.py calm|hit OUT_DIR
  calm  4 epochs of 8 steps, undisturbed.
  hit   the same; in the first generation rank 1 is SIGKILLed at step 20 (the third epoch),
        and the restarted generation resumes from the memory copies of step 16."""
import hashlib
import os
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from frameworks import torch_311_compat, torch_release_version  # noqa: E402

EPOCHS = 4
KILL_AT = 20


def main(mode, out):
    torch_311_compat()
    import torch
    torch_release_version(torch)
    import pytorch_lightning as pl
    import gpurun
    from gpurun.lightning import GpurunMemCheckpoint

    class Tiny(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 1)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.mse_loss(self.lin(x), y)

        def configure_optimizers(self):
            # Momentum: an optimizer state that must come back with the weights.
            return torch.optim.SGD(self.parameters(), lr=0.02, momentum=0.9)

    class Hit(pl.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, *rest):
            if (mode == "hit" and gpurun.restart_count() == 0 and trainer.global_rank == 1
                    and trainer.global_step == KILL_AT):
                print("rank 1 killed at step %d" % KILL_AT, flush=True)
                os.kill(os.getpid(), signal.SIGKILL)

    pl.seed_everything(0)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 8, generator=g)
    y = x @ torch.arange(1.0, 9.0).unsqueeze(1)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=4)
    nodes = int(os.environ["GROUP_WORLD_SIZE"])
    devices = int(os.environ["LOCAL_WORLD_SIZE"])
    mem = GpurunMemCheckpoint(every_n_epochs=1)
    trainer = pl.Trainer(accelerator="cpu", devices=devices, num_nodes=nodes, strategy="ddp",
                         max_epochs=EPOCHS, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         default_root_dir=out, callbacks=[mem, Hit()])
    model = Tiny()
    trainer.fit(model, loader, ckpt_path=mem.resume_path())
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().double().contiguous().numpy().tobytes())
    resumed = -1 if mem.resumed_step is None else mem.resumed_step
    print("memlane rank %d/%d steps %d resumed %d params %s"
          % (trainer.global_rank, trainer.world_size, trainer.global_step, resumed,
             h.hexdigest()[:16]), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
