"""Unit tests of gpurun.lightning and gpurun.hf against stand-ins for the frameworks' base
classes and trainer objects, and the fake agent: what each hook reports, and what the
pre-timeout signal makes them do. The real frameworks run in tests/integ/python_frameworks.sh
where they can be installed; these run everywhere.

Run: python3 -m unittest test_callbacks (in tests/python, lib/rank/python on PYTHONPATH)."""

import os
import signal
import sys
import time
import types
import unittest

import gpurun
import gpurun.hf
import gpurun.lightning
from test_gpurun import Base


class Scalar:
    """A one-element tensor as far as the callback cares."""

    def __init__(self, v):
        self.v = v

    def detach(self):
        return self

    def numel(self):
        return 1

    def item(self):
        return self.v


def stand_in(name, **attrs):
    m = types.ModuleType(name)
    m.__dict__.update(attrs)
    return m


class CallbackBase(Base):
    """Installs stand-in framework modules for one test and forgets the classes the
    callbacks' modules made from them."""

    modules = {}

    def setUp(self):
        super().setUp()
        self.saved_modules = {k: sys.modules.get(k) for k in self.modules}
        sys.modules.update(self.modules)
        self.old_usr1 = signal.getsignal(signal.SIGUSR1)
        for mod in (gpurun.lightning, gpurun.hf):
            for name in ("GpurunCallback", "GpurunTrainerCallback", "GpurunMemCheckpoint"):
                mod.__dict__.pop(name, None)

    def tearDown(self):
        for k, v in self.saved_modules.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
        signal.signal(signal.SIGUSR1, self.old_usr1)
        super().tearDown()

    def reports(self, n):
        self.agent.wait_for(lambda: len(self.agent.msgs("report")) >= n, what="%d reports" % n)
        return self.agent.msgs("report")

    def preempt_now(self):
        os.kill(os.getpid(), signal.SIGUSR1)
        time.sleep(0.01)
        self.assertTrue(gpurun.preempt_requested())


class LightningBase:
    pass


class Strategy:
    def __init__(self, others_preempted=False):
        self.others = others_preempted
        self.calls = []

    def reduce_boolean_decision(self, decision, all=True):
        self.calls.append(("reduce", decision, all))
        return decision or self.others

    def barrier(self, name=None):
        self.calls.append(("barrier", name))


class Trainer:
    def __init__(self, world_size=1, ckpt_dir=None, strategy=None):
        self.global_step = 0
        self.callback_metrics = {}
        self.estimated_stepping_batches = float("inf")
        self.max_steps = 50
        self.world_size = world_size
        self.strategy = strategy or Strategy()
        self.optimizers = [types.SimpleNamespace(param_groups=[{"lr": 0.125}])]
        self.checkpoint_callback = types.SimpleNamespace(dirpath=ckpt_dir) if ckpt_dir else None
        self.should_stop = False
        self.saved = []

    def save_checkpoint(self, path):
        self.saved.append(path)


class Lightning(CallbackBase):
    modules = {"lightning": stand_in("lightning"),
               "lightning.pytorch": stand_in("lightning.pytorch", Callback=LightningBase)}

    def test_subclass_of_the_frameworks_callback(self):
        from gpurun.lightning import GpurunCallback
        self.assertTrue(issubclass(GpurunCallback, LightningBase))
        self.assertEqual(GpurunCallback.__module__, "gpurun.lightning")

    def test_falls_back_to_pytorch_lightning(self):
        class PLBase:
            pass
        sys.modules["lightning.pytorch"] = None  # import fails
        sys.modules["pytorch_lightning"] = stand_in("pytorch_lightning", Callback=PLBase)
        try:
            from gpurun.lightning import GpurunCallback
            self.assertTrue(issubclass(GpurunCallback, PLBase))
        finally:
            del sys.modules["pytorch_lightning"]

    def test_reports(self):
        self.start_agent()
        from gpurun.lightning import GpurunCallback
        cb = GpurunCallback()
        t = Trainer()
        cb.setup(t, None, "fit")
        self.assertEqual(self.agent.msgs("preempt")[0]["type"], "preempt",
                         "setup(fit) must ask for the signal")
        t.global_step = 3
        t.callback_metrics = {"tokens_per_s": Scalar(5000.0)}
        cb.on_train_batch_end(t, None, Scalar(0.5), None, 0)
        t.global_step = 4
        t.estimated_stepping_batches = 40
        t.callback_metrics = {"train_loss": Scalar(0.25)}
        cb.on_train_batch_end(t, None, None, None, 1)
        t.global_step = 5
        cb.on_train_batch_end(t, None, {"loss": Scalar(0.125)}, None, 2)
        # A rate the step did not log is left out of its report (unknown, not 0).
        got = [(m["step"], m["loss"], m["lr"], m.get("tokens_per_s"), m["total_steps"])
               for m in self.reports(3)]
        self.assertEqual(got, [(3, 0.5, 0.125, 5000.0, 50), (4, 0.25, 0.125, None, 40),
                               (5, 0.125, 0.125, None, 40)])
        self.assertFalse(t.should_stop)

    def test_preempt_saves_then_stops(self):
        self.start_agent()
        from gpurun.lightning import GpurunCallback
        cb = GpurunCallback()
        t = Trainer(world_size=2, ckpt_dir="/ckpts", strategy=Strategy())
        cb.setup(t, None, "fit")
        cb.on_train_batch_end(t, None, Scalar(1.0), None, 0)
        self.assertEqual((t.should_stop, t.saved), (False, []))
        self.preempt_now()
        t.global_step = 7
        cb.on_train_batch_end(t, None, Scalar(1.0), None, 1)
        self.assertEqual(t.saved, ["/ckpts/preempted.ckpt"])
        self.assertTrue(t.should_stop)
        self.assertEqual(cb.preempted_at, 7)
        self.assertEqual(t.strategy.calls[-2:], [("reduce", True, False),
                                                 ("barrier", "gpurun_preempt")])

    def test_another_rank_preempted(self):
        self.start_agent()
        from gpurun.lightning import GpurunCallback
        cb = GpurunCallback(ckpt_path="/x/given.ckpt")
        t = Trainer(world_size=2, strategy=Strategy(others_preempted=True))
        cb.on_train_batch_end(t, None, Scalar(1.0), None, 0)
        self.assertEqual((t.should_stop, t.saved), (True, ["/x/given.ckpt"]))

    def test_no_checkpoint_path(self):
        self.start_agent()
        from gpurun.lightning import GpurunCallback
        cb = GpurunCallback()
        t = Trainer()
        cb.setup(t, None, "fit")
        self.preempt_now()
        cb.on_train_batch_end(t, None, Scalar(1.0), None, 0)
        self.assertEqual((t.should_stop, t.saved), (True, []))

    def test_outside_a_job(self):
        from gpurun.lightning import GpurunCallback
        cb = GpurunCallback()
        t = Trainer(world_size=2, strategy=Strategy(others_preempted=True))
        cb.setup(t, None, "fit")
        cb.on_train_batch_end(t, None, Scalar(1.0), None, 0)
        self.assertEqual((t.should_stop, t.strategy.calls), (False, []))
        self.assertEqual(signal.getsignal(signal.SIGUSR1), self.old_usr1)

    def test_mem_checkpoint_arguments(self):
        from gpurun.lightning import GpurunMemCheckpoint
        self.assertTrue(issubclass(GpurunMemCheckpoint, LightningBase))
        for bad in ({"every_n_epochs": -1}, {"every_n_train_steps": 1.5},
                    {"every_n_epochs": True}, {"name": "../x"}, {"name": ""}):
            with self.assertRaises(ValueError, msg=repr(bad)):
                GpurunMemCheckpoint(**bad)

    def test_mem_checkpoint_outside_a_job(self):
        from gpurun.lightning import GpurunMemCheckpoint
        mem = GpurunMemCheckpoint(every_n_epochs=1, every_n_train_steps=2)
        self.assertEqual(mem.resume_path(fallback="last"), "last")
        self.assertIsNone(mem.resume_path())
        t = Trainer()
        t.current_epoch = 0
        t.global_step = 2
        # No daemon keeps a copy: nothing is dumped, nothing is kept.
        dumped = []
        t._checkpoint_connector = types.SimpleNamespace(
            dump_checkpoint=lambda weights_only=False: dumped.append(1))
        mem.on_train_batch_end(t, None, None, None, 0)
        mem.on_train_epoch_end(t, None)
        self.assertEqual((mem.saved_step, dumped), (None, []))


class HFBase:
    pass


def hf_state(step, max_steps=100, tokens_seen=None):
    st = types.SimpleNamespace(global_step=step, max_steps=max_steps)
    if tokens_seen is not None:
        st.num_input_tokens_seen = tokens_seen
    return st


def hf_control():
    return types.SimpleNamespace(should_save=False, should_training_stop=False)


class HF(CallbackBase):
    modules = {"transformers": stand_in("transformers", TrainerCallback=HFBase)}

    def test_subclass_of_the_frameworks_callback(self):
        from gpurun.hf import GpurunTrainerCallback
        self.assertTrue(issubclass(GpurunTrainerCallback, HFBase))

    def test_reports(self):
        self.start_agent()
        from gpurun.hf import GpurunTrainerCallback
        cb = GpurunTrainerCallback()
        args = types.SimpleNamespace(device="cpu")
        cb.on_train_begin(args, hf_state(0), hf_control())
        self.assertEqual(len(self.agent.msgs("preempt")), 1)
        cb.on_log(args, hf_state(2), hf_control(), logs={"loss": 1.5, "learning_rate": 0.01})
        c = cb.on_step_end(args, hf_state(3), hf_control())
        cb.on_log(args, hf_state(4), hf_control(), logs={"eval_loss": 9.0})
        got = [(m["step"], m["loss"], m["lr"], m.get("total_steps")) for m in self.reports(3)]
        self.assertEqual(got, [(2, 1.5, 0.01, 100), (3, 1.5, 0.01, 100), (4, 1.5, 0.01, 100)])
        self.assertEqual((c.should_save, c.should_training_stop), (False, False))

    def test_tokens_per_s_from_tokens_seen(self):
        # The Trainer's count is the job's: 4 ranks, 8,000 tokens a step in all.
        self.start_agent()
        from gpurun.hf import GpurunTrainerCallback
        cb = GpurunTrainerCallback(preempt=False)
        args = types.SimpleNamespace(device="cpu", world_size=4)
        cb.on_train_begin(args, hf_state(0), hf_control())
        cb.on_step_end(args, hf_state(1, tokens_seen=8000), hf_control())
        time.sleep(0.2)
        cb.on_step_end(args, hf_state(3, tokens_seen=24000), hf_control())
        first, second = self.reports(2)
        self.assertNotIn("tokens_per_s", first)  # no rate before a second step
        # 4,000 tokens of this rank in a little over 0.2 s.
        self.assertGreater(second["tokens_per_s"], 4000 / 0.4)
        self.assertLessEqual(second["tokens_per_s"], 4000 / 0.2)

    def test_tokens_per_s_from_tokens_per_step(self):
        self.start_agent()
        from gpurun.hf import GpurunTrainerCallback
        cb = GpurunTrainerCallback(preempt=False, tokens_per_step=1000)
        args = types.SimpleNamespace(device="cpu")
        cb.on_train_begin(args, hf_state(0), hf_control())
        cb.on_step_end(args, hf_state(1), hf_control())
        time.sleep(0.2)
        cb.on_step_end(args, hf_state(2), hf_control())
        # An evaluation's log in between keeps the last rate.
        cb.on_log(args, hf_state(2), hf_control(), logs={"eval_loss": 9.0})
        rates = [m.get("tokens_per_s") for m in self.reports(3)]
        self.assertIsNone(rates[0])
        self.assertGreater(rates[1], 1000 / 0.4)
        self.assertLessEqual(rates[1], 1000 / 0.2)
        self.assertEqual(rates[2], rates[1])

    def test_preempt_saves_and_stops(self):
        self.start_agent()
        from gpurun.hf import GpurunTrainerCallback
        cb = GpurunTrainerCallback()
        args = types.SimpleNamespace(device="cpu")
        cb.on_train_begin(args, hf_state(0), hf_control())
        self.preempt_now()
        c = cb.on_step_end(args, hf_state(9), hf_control())
        self.assertEqual((c.should_save, c.should_training_stop, cb.preempted_at), (True, True, 9))

    def test_outside_a_job(self):
        from gpurun.hf import GpurunTrainerCallback
        cb = GpurunTrainerCallback()
        args = types.SimpleNamespace(device="cpu")
        cb.on_train_begin(args, hf_state(0), hf_control())
        c = cb.on_step_end(args, hf_state(1, max_steps=-1), hf_control())
        self.assertEqual((c.should_save, c.should_training_stop), (False, False))
        self.assertEqual(signal.getsignal(signal.SIGUSR1), self.old_usr1)


if __name__ == "__main__":
    unittest.main()
