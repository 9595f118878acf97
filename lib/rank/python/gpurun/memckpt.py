"""Memory checkpoints: a rank's state kept in its node's memory by gpurun's daemon, so that a
rank started again in the same allocation (a restart after a failure) takes it from there
rather than from disk.

    from gpurun import memckpt
    state = memckpt.load()                 # None on a first start
    if state is not None:
        step, sd = state
        model.load_state_dict(sd["model"])
    ...
    memckpt.save({"model": model.state_dict()}, step=step)

save(obj, name="state", step=0) keeps obj: bytes as they are, anything else as torch.save
writes it (a state dict; torch is imported only then). The daemon keeps the newest complete
copy of each name (a rank that dies while saving leaves the older one) in a file of /dev/shm
(GPURUN_MEM_DIR), within the node's cap (gpurun --mem-ckpt-max): a save that does not fit
raises gpurun.Error with the sizes, and the older copy stays. load(name="state") returns
(step, obj) or None where there is no copy. Outside a gpurun job, or on a node that keeps
none, save does nothing and returns False, load returns None."""

import io
import os

from . import _link
from . import _Locked, _the_place, in_job

NAME_MAX = 64
_MAGIC = b"GRMEM1"
_RAW, _TORCH = b"b", b"t"


def _check_name(what, name):
    ok = (isinstance(name, str) and 0 < len(name) <= NAME_MAX and not name.startswith(".")
          and all(c.isascii() and (c.isalnum() or c in "_-.") for c in name))
    if not ok:
        raise ValueError("gpurun.memckpt.%s: %r is not a name (letters, digits, '_', '-', '.'; "
                         "at most %d)" % (what, name, NAME_MAX))


def _dir():
    d = os.environ.get("GPURUN_MEM_DIR")
    return d if in_job() and d else None


def save(obj, name="state", step=0):
    """Keeps obj as this rank's copy of name at step; True once the daemon kept it, False
    where there is no daemon to keep it."""
    _check_name("save", name)
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError("gpurun.memckpt.save: step %r is not a whole number >= 0" % (step,))
    d = _dir()
    if d is None:
        return False
    if isinstance(obj, (bytes, bytearray, memoryview)):
        kind, payload = _RAW, bytes(obj)
    else:
        import torch
        buf = io.BytesIO()
        torch.save(obj, buf)
        kind, payload = _TORCH, buf.getvalue()
    path = os.path.join(d, "r%d.%s.tmp" % (_the_place().rank, name))
    with open(path, "wb") as f:
        f.write(_MAGIC + kind)
        f.write(payload)
    with _Locked("memckpt.save") as c:
        c.request({"type": "mem_save", "name": name, "step": step}, _link.REQUEST_TIMEOUT,
                  "mem_save", name)
    return True


def load(name="state", map_location="cpu"):
    """(step, obj) of this rank's copy of name, or None where there is none."""
    _check_name("load", name)
    if _dir() is None:
        return None
    with _Locked("memckpt.load") as c:
        try:
            m = c.request({"type": "mem_load", "name": name}, _link.REQUEST_TIMEOUT,
                          "mem_load", name)
        except _link.NotFound:
            return None
    with open(m["path"], "rb") as f:
        data = f.read()
    if len(data) != m["size"] or not data.startswith(_MAGIC):
        raise _link.Error("gpurun.memckpt.load '%s': '%s' is not a copy saved by "
                          "gpurun.memckpt.save" % (name, m["path"]))
    kind, payload = data[len(_MAGIC):len(_MAGIC) + 1], data[len(_MAGIC) + 1:]
    if kind == _RAW:
        return m["step"], payload
    import torch
    return m["step"], torch.load(io.BytesIO(payload), map_location=map_location,
                                 weights_only=False)
