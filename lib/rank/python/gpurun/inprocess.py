"""Regrouping in process for a torch.distributed script: where a node is lost and a spare
takes its place, the ranks of the other nodes keep their processes (their CUDA context,
their data loaders, their live state) and go on with the spare's new ranks, instead of every
rank being restarted and reloading the last checkpoint.

    import gpurun.inprocess as inprocess

    model = build_model()                       # once per process
    opt = torch.optim.AdamW(model.parameters())
    pos = {"step": 0}

    def train(generation):
        # Every start and every regroup: rank 0's live state, on every rank.
        s = inprocess.share({"model": model.state_dict(), "opt": opt.state_dict(),
                             "step": pos["step"]})
        model.load_state_dict(s["model"]); opt.load_state_dict(s["opt"]); pos["step"] = s["step"]
        ddp = DistributedDataParallel(model)
        while pos["step"] < steps:
            ...one step with ddp and opt...
            pos["step"] += 1                     # only once the step's update is made

    inprocess.run(train, backend="gloo")

run(fn, backend="gloo", timeout=None, regroup_timeout=120) sets up torch's default process
group (init_process_group below), says that this rank can regroup (gpurun.regroup_enable()),
and calls fn(generation). Where fn raises what torch raises when a collective fails (a gloo
pair closed by a dead peer, an aborted NCCL communicator: collective_failure(err)) inside a
gpurun job, run drops the failed call's frames (their DistributedDataParallel still names the
old group), destroys the process group, waits for the leader's next generation
(gpurun.regroup()), re-forms the group with the spare's new ranks and calls fn again. It
prints one line a regroup to stderr. Where the job does not regroup (no spare, a rank that never said it can,
the job torn down: gpurun.Aborted) or no generation came within regroup_timeout seconds (the
error was not a peer's loss), the first error is raised again, with the reason chained; any
other error (the script's own, an out-of-memory) is raised at once. fn's return value is
run's. Outside a gpurun job fn is called once, as under torchrun.

The step in flight is lost: fn must count a step only once its update is made, keep its state
outside the call (a regroup calls it again in the same process) and take rank 0's state on
every call (share()), so that the spare's new ranks and the regrouped ones start from the same
step. Node 0 (rank 0's) is never the lost one: it runs gpurun's leader.

init_process_group(backend="gloo", timeout=None) makes torch's default process group of
generation() over the job's TCPStore (rank 0 serves it on MASTER_ADDR:MASTER_PORT; this
module keeps it across generations, each generation's keys under a prefix of its own, so
that a spare's new rank and a regrouped one meet). With NCCL it sets
TORCH_NCCL_ASYNC_ERROR_HANDLING=2 (a failed collective raises rather than ending the
process) unless the job set another value than gpurun's default. Outside a gpurun job it is
torch's own env:// init_process_group. destroy() ends the group; regroup(timeout) destroys
it, waits for the next generation and makes the group again, returning the generation.
share(obj, src=0) returns src's obj on every rank (torch.distributed.broadcast_object_list).

torch is imported by this module, not by `import gpurun`.
"""

import datetime
import gc
import os
import sys
import traceback

import torch
import torch.distributed as dist

import gpurun

_store = None  # the job's TCPStore, kept across generations
_backend = None
_timeout = None


def _env_int(name):
    v = os.environ.get(name, "")
    if not (v.isascii() and v.isdigit()):
        raise gpurun.Error("gpurun.inprocess: %s is %r, not a number" % (name, v))
    return int(v)


def init_process_group(backend="gloo", timeout=None):
    """Makes torch's default process group for this rank's generation."""
    global _store, _backend, _timeout
    if timeout is None:
        timeout = datetime.timedelta(minutes=30)
    _backend, _timeout = backend, timeout
    if not gpurun.in_job():
        dist.init_process_group(backend, timeout=timeout)
        return
    if "nccl" in str(backend) and os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1") == "1":
        os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "2"
    rank, world = gpurun.rank(), gpurun.world_size()
    if _store is None:
        _store = dist.TCPStore(os.environ["MASTER_ADDR"], _env_int("MASTER_PORT"), world,
                               rank == 0, timeout=timeout, wait_for_workers=False)
    store = dist.PrefixStore("gpurun/generation %d/" % gpurun.generation(), _store)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)


def destroy():
    """Ends torch's default process group, where there is one."""
    if dist.is_initialized():
        dist.destroy_process_group()


def regroup(timeout=120):
    """Destroys the process group, waits for the next generation and makes the group again;
    returns the generation. gpurun.Aborted, gpurun.TimeoutError: see gpurun.regroup()."""
    destroy()
    gen = gpurun.regroup(timeout)
    init_process_group(_backend or "gloo", _timeout)
    return gen


def share(obj, src=0):
    """src's obj on every rank of the group."""
    box = [obj if dist.get_rank() == src else None]
    dist.broadcast_object_list(box, src=src)
    return box[0]


# Words of torch's failed collectives where their class does not say it (torch before 2.0
# raises a plain RuntimeError with the backend's text).
_COLLECTIVE_WORDS = ("gloo", "nccl", "NCCL", "Connection reset", "Connection closed",
                     "Broken pipe", "ProcessGroup", "communicator")


def collective_failure(err):
    """Whether err is torch's word of a failed collective (a peer gone, a communicator
    aborted), not the script's own error: a DistBackendError, or a RuntimeError in the words
    of gloo or NCCL; never an out-of-memory error."""
    oom = getattr(getattr(torch, "cuda", None), "OutOfMemoryError", None)
    if oom is not None and isinstance(err, oom):
        return False
    backend_error = getattr(dist, "DistBackendError", None)
    if backend_error is not None and isinstance(err, backend_error):
        return True
    text = str(err)
    if "out of memory" in text:
        return False
    return isinstance(err, RuntimeError) and any(w in text for w in _COLLECTIVE_WORDS)


def run(fn, backend="gloo", timeout=None, regroup_timeout=120):
    """Calls fn(generation) until it returns, regrouping in process where a peer is lost."""
    init_process_group(backend, timeout)
    if not gpurun.in_job():
        return fn(0)
    gpurun.regroup_enable()
    while True:
        try:
            return fn(gpurun.generation())
        except RuntimeError as e:
            if not collective_failure(e):
                raise
            err = e
        # The failed call's locals (a DistributedDataParallel whose hooks reduce over the old
        # group) go before the next call; the traceback stays for the error's report.
        traceback.clear_frames(err.__traceback__)
        gc.collect()
        was = gpurun.generation()
        print("gpurun: rank %d: a collective failed in generation %d (%s): regrouping"
              % (gpurun.rank(), was, str(err).splitlines()[0] if str(err) else
                 type(err).__name__), file=sys.stderr, flush=True)
        try:
            gen = regroup(regroup_timeout)
        except gpurun.Error as why:
            raise err from why
        print("gpurun: rank %d regrouped in process as generation %d" % (gpurun.rank(), gen),
              file=sys.stderr, flush=True)
        err = None
