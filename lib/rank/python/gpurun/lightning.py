"""gpurun for PyTorch Lightning: a Callback that reports each training step and stops the run
cleanly, with a checkpoint, on the pre-timeout signal.

    from gpurun.lightning import GpurunCallback
    trainer = Trainer(..., callbacks=[GpurunCallback()])

`import gpurun.lightning` imports nothing of Lightning: the class is made on first use of
GpurunCallback, as a subclass of `lightning.pytorch.Callback`, or of
`pytorch_lightning.Callback` where only that package is installed.

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
"""

import math
import os

import gpurun


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


def __getattr__(name):
    if name == "GpurunCallback":
        cls = _make()
        globals()[name] = cls
        return cls
    raise AttributeError("module %r has no attribute %r" % (__name__, name))
