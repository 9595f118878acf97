"""gpurun for PyTorch Lightning: a Callback that reports each training step and stops the run
cleanly, with a checkpoint, on the pre-timeout signal.

    from gpurun.lightning import GpurunCallback
    trainer = Trainer(..., callbacks=[GpurunCallback()])

`import gpurun.lightning` imports nothing of Lightning: each class is made on first use of
its name, as a subclass of `lightning.pytorch.Callback`, or of `pytorch_lightning.Callback`
where only that package is installed.

What it reports, after every training batch (gpurun.report):
- step: trainer.global_step (optimizer steps taken);
- loss: the batch's loss as training_step returned it (a tensor, or the "loss" of a dict),
  else the metric named loss_key that the module logged (trainer.callback_metrics);
- lr: the learning rate of the first parameter group of the first optimizer;
- tokens_per_s: the metric named throughput_key when the module (or a throughput monitor)
  logs it; otherwise nothing;
- total_steps: trainer.estimated_stepping_batches when finite, else max_steps when set.

The pre-timeout signal: at setup (fit) the callback asks for it (gpurun.on_preempt; setup
runs in the main thread). After each batch the ranks agree whether any of them got it (one
boolean reduce of the strategy, so that every rank stops at the same step); then each
checkpoints and stops: trainer.save_checkpoint(path) (every rank calls it; the strategy
writes once, and a barrier follows, so that no rank stops before the file is written) with
path the ckpt_path given, else "preempted.ckpt" in the ModelCheckpoint callback's directory,
else no checkpoint; then trainer.should_stop = True. Outside a gpurun
job, or with preempt=False, nothing of this happens.

Memory checkpoints (gpurun.memckpt), so that a restart after a failure (a rank's, a node's with
or without a spare) resumes from the last one rather than from disk:

    from gpurun.lightning import GpurunMemCheckpoint
    mem = GpurunMemCheckpoint(every_n_epochs=1)
    trainer = Trainer(..., callbacks=[mem])
    trainer.fit(model, loader, ckpt_path=mem.resume_path(fallback="last"))

Every every_n_epochs epochs (at the end of the training epoch) and every every_n_train_steps
optimizer steps (0: never), each rank keeps the whole Lightning checkpoint of its trainer (what
trainer.save_checkpoint writes: weights, optimizer states, loops, callbacks) as its memory copy
named name; its node's daemon keeps it and sends it to another node's. resume_path, called
before fit on every rank, gives the file of this rank's copy when every rank of the job has a
copy of the same step, else fallback (a path, "last", or None: Lightning's own resume
rules), so that no rank resumes alone from another step. A first start has none.
"""

import io
import math
import os
import sys

import gpurun
from gpurun import memckpt


def _base():
    try:
        from lightning.pytorch import Callback
    except ImportError:
        from pytorch_lightning import Callback
    return Callback


def _scalar(v):
    """A float from a tensor, a number or None (None when it is neither)."""
    if v is None:
        return None
    try:
        if hasattr(v, "detach"):
            v = v.detach()
            if v.numel() != 1:
                return None
            v = v.item()
        return float(v)
    except (TypeError, ValueError, RuntimeError):
        return None


def _make():
    Callback = _base()

    class GpurunCallback(Callback):
        """Reports training progress to gpurun and stops on the pre-timeout signal (see the
        module's text). loss_key and throughput_key name logged metrics; ckpt_path is where
        the preemption checkpoint goes; preempt=False leaves the signal alone."""

        def __init__(self, loss_key="train_loss", throughput_key="tokens_per_s",
                     ckpt_path=None, preempt=True):
            super().__init__()
            self.loss_key = loss_key
            self.throughput_key = throughput_key
            self.ckpt_path = ckpt_path
            self.preempt = preempt
            self.preempted_at = None  # the global step the run stopped at, once it did

        def setup(self, trainer, pl_module, stage=None):
            if self.preempt and stage in (None, "fit") and gpurun.in_job():
                gpurun.on_preempt()

        def _total_steps(self, trainer):
            est = getattr(trainer, "estimated_stepping_batches", None)
            try:
                if est is not None and math.isfinite(est) and est > 0:
                    return int(est)
            except (TypeError, ValueError):
                pass
            max_steps = getattr(trainer, "max_steps", -1)
            return max_steps if isinstance(max_steps, int) and max_steps > 0 else None

        def _loss(self, trainer, outputs):
            if isinstance(outputs, dict):
                outputs = outputs.get("loss")
            loss = _scalar(outputs)
            if loss is None:
                loss = _scalar(trainer.callback_metrics.get(self.loss_key))
            return loss

        def _lr(self, trainer):
            try:
                return float(trainer.optimizers[0].param_groups[0]["lr"])
            except (IndexError, KeyError, TypeError, ValueError, AttributeError):
                return None

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, *rest):
            gpurun.report(trainer.global_step, loss=self._loss(trainer, outputs),
                          lr=self._lr(trainer),
                          tokens_per_s=_scalar(trainer.callback_metrics.get(self.throughput_key)),
                          total_steps=self._total_steps(trainer))
            if self.preempt and gpurun.in_job() and self._any_preempted(trainer):
                self.on_preempt(trainer, pl_module)

        def _any_preempted(self, trainer):
            mine = gpurun.preempt_requested()
            if trainer.world_size <= 1:
                return mine
            try:
                return bool(trainer.strategy.reduce_boolean_decision(mine, all=False))
            except TypeError:  # pytorch-lightning 1.x: no "all", every rank must agree
                return not bool(trainer.strategy.reduce_boolean_decision(not mine))

        def checkpoint_path(self, trainer):
            """Where the preemption checkpoint goes, or None."""
            if self.ckpt_path:
                return self.ckpt_path
            ckpt = getattr(trainer, "checkpoint_callback", None)
            d = getattr(ckpt, "dirpath", None)
            return os.path.join(d, "preempted.ckpt") if d else None

        def on_preempt(self, trainer, pl_module):
            """Checkpoints (when a path is known) and stops the run; override to do more."""
            path = self.checkpoint_path(trainer)
            if path:
                trainer.save_checkpoint(path)
                # One rank writes it; none stops before it is on disk.
                trainer.strategy.barrier("gpurun_preempt")
            self.preempted_at = trainer.global_step
            trainer.should_stop = True

    GpurunCallback.__module__ = __name__
    return GpurunCallback


def _make_mem():
    Callback = _base()

    class GpurunMemCheckpoint(Callback):
        """Keeps each rank's whole Lightning checkpoint in memory (gpurun.memckpt) every
        every_n_epochs epochs and every every_n_train_steps steps (0: never); resume_path
        gives the file a restart resumes from (see the module's text)."""

        def __init__(self, every_n_epochs=1, every_n_train_steps=0, name="lightning"):
            super().__init__()
            for what, v in (("every_n_epochs", every_n_epochs),
                            ("every_n_train_steps", every_n_train_steps)):
                if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                    raise ValueError("GpurunMemCheckpoint: %s %r is not a whole number >= 0"
                                     % (what, v))
            memckpt._check_name("GpurunMemCheckpoint", name)
            self.every_n_epochs = every_n_epochs
            self.every_n_train_steps = every_n_train_steps
            self.name = name
            self.saved_step = None    # the global step of the last copy kept
            self.resumed_step = None  # the step resume_path's copy holds, once it gave one

        def _save(self, trainer):
            import torch
            step = int(trainer.global_step)
            if step == self.saved_step or memckpt._dir() is None:
                return
            # What trainer.save_checkpoint writes, without its writing rank and its barrier:
            # every rank keeps its own.
            ckpt = trainer._checkpoint_connector.dump_checkpoint(weights_only=False)
            buf = io.BytesIO()
            torch.save(ckpt, buf)
            if memckpt.save(buf.getbuffer(), name=self.name, step=step):
                self.saved_step = step

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, *rest):
            n = self.every_n_train_steps
            if n and trainer.global_step > 0 and trainer.global_step % n == 0:
                self._save(trainer)

        def on_train_epoch_end(self, trainer, pl_module):
            n = self.every_n_epochs
            if n and (trainer.current_epoch + 1) % n == 0:
                self._save(trainer)

        def resume_path(self, fallback=None):
            """The file of this rank's memory copy when every rank has one of the same step;
            fallback otherwise. Every rank must call it (the ranks agree through gpurun's
            store), before fit."""
            if not gpurun.in_job():
                return fallback
            got = memckpt.load(self.name)
            step = got[0] if got is not None else -1
            key = "gpurun.lightning.%s.g%d" % (self.name, gpurun.restart_count())
            gpurun.set("%s.r%d" % (key, gpurun.rank()), str(step))
            steps = [int(gpurun.get("%s.r%d" % (key, r)))
                     for r in range(gpurun.world_size())]
            if step < 0 or any(s != step for s in steps):
                if step >= 0 or any(s >= 0 for s in steps):
                    print("gpurun: rank %d does not resume from memory: the ranks' copies of "
                          "'%s' are of steps %s" % (gpurun.rank(), self.name, steps),
                          file=sys.stderr, flush=True)
                return fallback
            path = os.path.join(os.environ["GPURUN_MEM_DIR"],
                                "r%d.%s.ckpt" % (gpurun.rank(), self.name))
            with open(path + ".tmp", "wb") as f:
                f.write(got[1])
            os.replace(path + ".tmp", path)
            self.resumed_step = step
            print("gpurun: rank %d resumes from its memory checkpoint '%s' of step %d"
                  % (gpurun.rank(), self.name, step), flush=True)
            return path

    GpurunMemCheckpoint.__module__ = __name__
    return GpurunMemCheckpoint


_MAKERS = {"GpurunCallback": _make, "GpurunMemCheckpoint": _make_mem}


def __getattr__(name):
    if name in _MAKERS:
        cls = _MAKERS[name]()
        globals()[name] = cls
        return cls
    raise AttributeError("module %r has no attribute %r" % (__name__, name))
