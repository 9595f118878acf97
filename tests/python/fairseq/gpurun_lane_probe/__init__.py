"""A fairseq user module (common.user_dir) for the frameworks lane: it changes nothing in
training, and prints each rank's lane line (tests/python/lane.py) at the end of the run: the
world fairseq's data-parallel group saw, the last update's loss as fairseq reduced it, and a
digest of the model's parameters. fairseq logs on its master rank only; this line comes from
every rank."""

import atexit
import os
import sys

import fairseq.trainer
import torch.distributed
from fairseq.distributed import utils as dist_utils

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import lane  # noqa: E402

_train_step = fairseq.trainer.Trainer.train_step
_seen = {}


def train_step(self, samples, raise_oom=False):
    out = _train_step(self, samples, raise_oom)
    _seen["trainer"] = self
    _seen["steps"] = _seen.get("steps", 0) + 1
    if out is not None and "loss" in out:
        _seen["loss"] = float(out["loss"])
    return out


def _report():
    trainer = _seen.get("trainer")
    if trainer is None:
        return
    # A rank that trains alone never initialises torch.distributed: world 1.
    together = torch.distributed.is_initialized()
    lane.report("fairseq", dist_utils.get_data_parallel_rank() if together else 0,
                dist_utils.get_data_parallel_world_size() if together else 1,
                int(os.environ.get("LOCAL_RANK", "0")),
                int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
                _seen.get("loss", float("nan")), trainer.model.parameters(), _seen["steps"])


fairseq.trainer.Trainer.train_step = train_step
atexit.register(_report)
