"""gpurun for Hugging Face transformers: a TrainerCallback that reports training progress and
saves and stops on the pre-timeout signal.

    from gpurun.hf import GpurunTrainerCallback
    trainer = Trainer(..., callbacks=[GpurunTrainerCallback()])

`import gpurun.hf` imports nothing of transformers: the class is made on first use of
GpurunTrainerCallback, as a subclass of `transformers.TrainerCallback`.

What it reports (gpurun.report):
- on_log: state.global_step with logs["loss"] and logs["learning_rate"] (those the Trainer
  logs every logging_steps; a log without them, an evaluation's, keeps the last ones),
  total_steps=state.max_steps;
- on_step_end: state.global_step with the last logged loss and learning rate, so that
  `gpurun status` and the job's hang detection see every step, not only the logged ones.
- tokens_per_s, this rank's: from state.num_input_tokens_seen when the Trainer counts it
  (TrainingArguments(include_num_input_tokens_seen=True), transformers 4.38 and later; the
  count is the whole job's, so it is divided by the world size), else from tokens_per_step
  (this rank's tokens per optimizer step, e.g. per_device_train_batch_size x
  gradient_accumulation_steps x sequence length) when given, over the time since the last
  report; none otherwise (the Trainer does not know a sequence's length).

The pre-timeout signal: at on_train_begin (in the main thread, where Trainer.train runs) the
callback asks for it (gpurun.on_preempt). After each step the ranks agree whether any of them
got it (one all-reduce of a flag when torch.distributed is initialised, so that every rank
saves and stops at the same step); then control.should_save = True and
control.should_training_stop = True: the Trainer saves a checkpoint (checkpoint-N in
output_dir, whatever its save_strategy) and ends train(). Outside a gpurun job, or with
preempt=False, nothing of this happens.
"""

import sys
import time

import gpurun


def _any_rank(flag, device):
    """flag of any rank, when torch.distributed runs with more than one rank; else flag."""
    # A Trainer that runs distributed imported torch.distributed long ago.
    dist = sys.modules.get("torch.distributed")
    if dist is None or not (dist.is_available() and dist.is_initialized()) or \
            dist.get_world_size() <= 1:
        return flag
    import torch
    t = torch.tensor([1 if flag else 0], dtype=torch.int32,
                     device=device if dist.get_backend() == "nccl" else "cpu")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def _make():
    from transformers import TrainerCallback

    class GpurunTrainerCallback(TrainerCallback):
        """Reports progress to gpurun and saves and stops on the pre-timeout signal (see the
        module's text); preempt=False leaves the signal alone."""

        def __init__(self, preempt=True, tokens_per_step=None):
            super().__init__()
            self.preempt = preempt
            self.tokens_per_step = tokens_per_step
            self.loss = None
            self.lr = None
            self.rate = None
            self.mark = None  # (time, global step, tokens seen) at the last rate
            self.preempted_at = None  # the global step the run stopped at, once it did

        def _total(self, state):
            return state.max_steps if state.max_steps and state.max_steps > 0 else None

        def _tokens_per_s(self, args, state):
            """This rank's tokens per second since the last call that moved the step, or
            the last rate; None when there is nothing to count tokens with."""
            now = time.monotonic()
            seen = getattr(state, "num_input_tokens_seen", 0) or 0
            if seen > 0:
                seen /= max(1, getattr(args, "world_size", 1) or 1)
            if self.mark is not None:
                t0, step0, seen0 = self.mark
                if state.global_step > step0 and now > t0:
                    if seen > seen0:
                        self.rate = (seen - seen0) / (now - t0)
                    elif self.tokens_per_step:
                        self.rate = self.tokens_per_step * (state.global_step - step0) / (now - t0)
            if self.mark is None or state.global_step > self.mark[1]:
                self.mark = (now, state.global_step, seen)
            return self.rate

        def on_train_begin(self, args, state, control, **kwargs):
            self.mark = None
            if self.preempt and gpurun.in_job():
                gpurun.on_preempt()

        def on_log(self, args, state, control, logs=None, **kwargs):
            logs = logs or {}
            if "loss" in logs:
                self.loss = logs["loss"]
            if "learning_rate" in logs:
                self.lr = logs["learning_rate"]
            gpurun.report(state.global_step, loss=self.loss, lr=self.lr,
                          tokens_per_s=self.rate, total_steps=self._total(state))

        def on_step_end(self, args, state, control, **kwargs):
            gpurun.report(state.global_step, loss=self.loss, lr=self.lr,
                          tokens_per_s=self._tokens_per_s(args, state),
                          total_steps=self._total(state))
            if self.preempt and gpurun.in_job() and _any_rank(gpurun.preempt_requested(),
                                                              args.device):
                self.preempted_at = state.global_step
                control.should_save = True
                control.should_training_stop = True
            return control

    GpurunTrainerCallback.__module__ = __name__
    return GpurunTrainerCallback


def __getattr__(name):
    if name == "GpurunTrainerCallback":
        cls = _make()
        globals()[name] = cls
        return cls
    raise AttributeError("module %r has no attribute %r" % (__name__, name))
