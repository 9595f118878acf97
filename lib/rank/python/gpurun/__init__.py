"""gpurun's rank library for Python: what a training script gets from the job it runs in.

A rank started by gpurun (rendezvousd) talks to its node's agent over the Unix socket named
by GPURUN_SOCK, as C ranks do through lib/rank/gr.h, and shares the job's store with them (values
travel as base64 on both sides, so a key put by either is read byte for byte by the other).
Standard library only; Python 3.8 or later.

    import gpurun
    gpurun.on_preempt(lambda sig: None)        # ask for the pre-timeout signal
    for step in range(start, steps):
        loss = train_step()
        gpurun.report(step, loss=loss, total_steps=steps)
        if gpurun.preempt_requested():
            save_checkpoint(); break

Place: rank(), local_rank(), world_size(), local_world_size(), node_rank(), restart_count(),
job_id(), in_job(), from the environment the agent set.

Progress: report(step, *, loss, lr, tokens_per_s, grad_norm, total_steps, step_time) sends what
`gpurun status` shows. It never waits for the agent and never raises because of it (a
report the agent cannot take now is dropped; the next one carries newer numbers). A step
that is not an integer (a bool, a str, None, a float with a fraction) raises TypeError, a
negative step or total_steps ValueError; a number that is None, not finite (a NaN or
infinite loss), or negative where it cannot be (tokens_per_s, grad_norm, step_time) is left
out of the report, as the C library does, and status shows it as unknown (a step_time of 0
too, quietly); each kind of number left out prints one line to stderr per
process, the first time, naming the caller ("gpurun.report: train.py:42: loss is nan: not
reported", "... loss is inf: ...", "... tokens_per_s is -5 (negative): not reported").

Store: set(key, value), get(key, timeout=None), delete(key), barrier(name=None,
timeout=None). Keys and barrier names are str of 1..256 bytes of UTF-8; values are bytes (or
str, stored as its UTF-8) of at most 196608 bytes; both are checked before anything is sent
(TypeError for a key that is not a str, ValueError for an empty, over-long or non-UTF-8 one
and an over-long value). get() returns bytes: timeout None waits as long as the job lives,
0 does not wait (KeyError for a missing key), a number of seconds raises TimeoutError when
it runs out. barrier() returns once every rank of the job called it with the same name;
without a name it is the next of the implicit sequence "#0", "#1"... that the C library's
gr_barrier(NULL) also counts, the same on every rank. A barrier given up on stays counted.
Failures raise gpurun.Error (a RuntimeError) with the agent's message, gpurun.TimeoutError
(also the builtin TimeoutError) for waits that ran out. After the link broke (the agent
closed it, or sent something that makes no sense) every request raises the same Error.

Pre-timeout signal: on_preempt(callback) installs a handler for GPURUN_PREEMPT_SIGNAL
(SIGUSR1 unless the job chose another) that records the request and calls callback(signum),
then asks the agent to forward the signal to this rank (a rank that does not ask never gets
it). Call it from the main thread: Python runs signal handlers there, between bytecodes, so
the callback interrupts whatever the main thread does; it should set a flag or save and
exit, not call get(), set() or barrier() (these raise Error when the handler interrupted
this module). preempt_requested() says whether the signal came. The agent signals the
process that asked, not its children (DataLoader workers started with spawn have no handler
and would die of it); a child forked from the rank inherits the handler, which does nothing
there. With the job's own --signal, Slurm's rule applies instead: every process of every
rank gets it.

Regrouping in process: regroup_enable() says this rank can go on after a peer's loss;
where every rank of the other nodes said so and a spare covers a lost node, the job's next
generation keeps their processes. regroup(timeout=300), called once the rank's collectives
failed, waits for that generation and returns it (gpurun.Aborted where the job is torn down
instead); generation() is the current one. gpurun.inprocess does it all for a
torch.distributed script (its own docstring).

finalize() tells the agent this rank is done with the library; an atexit hook does it for a
process that talked to the agent. Later requests raise Error, reports are dropped.

Threads and processes: every function may be called from any thread (one lock; a thread
waiting for the agent does not hold it, so report() and other requests go on meanwhile). A
child process forked from a rank never uses its parent's connection: its first request opens
its own, as the same rank (its barriers would count as the rank's: keep them to the rank).

Outside a gpurun job (GPURUN_SOCK unset) every call is a quiet no-op, so that the same script
runs anywhere: rank(), local_rank() and node_rank() are 0, world_size() and
local_world_size() 1 (torchrun's RANK, LOCAL_RANK, GROUP_RANK, WORLD_SIZE and
LOCAL_WORLD_SIZE where they are set), restart_count() 0 (TORCHELASTIC_RESTART_COUNT where
set), job_id() None, in_job() False; report(), set(), delete(), barrier() and finalize() do
nothing and return None, get() returns None, on_preempt() installs nothing and returns None,
preempt_requested() is False, regroup_enable() does nothing, generation() is
restart_count() and regroup() raises Error. Argument checks (TypeError, ValueError) apply
everywhere.
"""

import atexit
import math
import numbers
import operator
import os
import signal as _signal
import sys
import threading

from . import _link
from ._link import KEY_MAX, NAME_MAX, VALUE_MAX, Aborted, Error, TimeoutError

__version__ = "0.1.0"

__all__ = [
    "Error", "TimeoutError", "Aborted", "KEY_MAX", "NAME_MAX", "VALUE_MAX",
    "in_job", "rank", "local_rank", "world_size", "local_world_size", "node_rank",
    "restart_count", "job_id", "report", "set", "get", "delete", "barrier", "on_preempt",
    "preempt_requested", "generation", "regroup_enable", "regroup", "finalize",
]

# The finalize of the atexit hook waits this long for the agent: an exit must not hang on a
# stuck agent for the two minutes an explicit request gets.
_EXIT_FINALIZE_TIMEOUT = 10.0
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1

_place = None  # _link.Place, read once per process in a job
_conn = None  # _link.Link of this process, opened by its first request or report
_finalized = False
_warned = set()  # the kinds of number left out ("loss is nan") this process warned of
_preempted = False
_preempt_callback = None
_preempt_pid = None  # the process that installed the handler
_generation = None  # the generation of this process's last regroup(); None: restart_count()


def in_job():
    """Whether this process was started by gpurun (GPURUN_SOCK is set)."""
    return os.environ.get("GPURUN_SOCK") is not None


def _the_place():
    global _place
    if _place is None:
        _place = _link.Place()
    return _place


def _outside(names, default):
    """The first of the environment variables names that holds a decimal number (torchrun's
    place outside a gpurun job), else default."""
    for n in names:
        v = os.environ.get(n, "")
        if v.isascii() and v.isdigit():
            return int(v)
    return default


def rank():
    """This rank's place in the job, 0..world_size()-1."""
    return _the_place().rank if in_job() else _outside(["RANK"], 0)


def local_rank():
    """This rank's place on its node, 0..local_world_size()-1."""
    return _the_place().local_rank if in_job() else _outside(["LOCAL_RANK"], 0)


def world_size():
    """The job's number of ranks."""
    return _the_place().world_size if in_job() else _outside(["WORLD_SIZE"], 1)


def local_world_size():
    """The number of ranks on this node."""
    return _the_place().local_world_size if in_job() else _outside(["LOCAL_WORLD_SIZE"], 1)


def node_rank():
    """This node's place in the job, 0..nodes-1."""
    return _the_place().node_rank if in_job() else _outside(["NODE_RANK", "GROUP_RANK"], 0)


def restart_count():
    """How many times the job's ranks were restarted after a failure (0 in the first run)."""
    if in_job():
        return _link.env_int("GPURUN_RESTART_COUNT", 0)
    return _outside(["TORCHELASTIC_RESTART_COUNT"], 0)


def job_id():
    """The job's id (Slurm's job id, or "local-..." for gpurun --local); None outside."""
    return os.environ.get("GPURUN_JOB_ID") if in_job() else None


# --- the link ---------------------------------------------------------------------------------


class _Locked:
    """`with _Locked(what):` holds the module's lock and yields the process's link (None
    after finalize()). A signal handler that interrupted this thread inside the module gets
    Error instead of a deadlock."""

    def __init__(self, what):
        self.what = what

    def __enter__(self):
        global _conn
        try:
            _link.acquire()
        except _link.Reentered:
            raise Error("gpurun.%s: called from a signal handler while this thread was inside "
                        "gpurun" % self.what) from None
        if _conn is None and not _finalized:
            try:
                _conn = _link.Link(_the_place())
            except BaseException:
                _link.release()
                raise
        if _finalized:
            _link.release()
            raise Error("gpurun.%s: called after gpurun.finalize()" % self.what)
        return _conn

    def __exit__(self, *exc):
        _link.release()
        return False


def _after_fork_in_child():
    global _conn, _warned
    _link.reset_after_fork()
    if _conn is not None and _conn.sock is not None:
        # Closing our copy of the descriptor leaves the parent's connection as it was.
        try:
            _conn.sock.close()
        except OSError:
            pass
    _conn = None
    _warned = set()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


# --- checks -----------------------------------------------------------------------------------


def _check_key(what, key, kind="key", limit=KEY_MAX):
    """The key's UTF-8 bytes, or TypeError/ValueError naming what is wrong with it."""
    if not isinstance(key, str):
        raise TypeError("gpurun.%s: %s must be a str, not %s" % (what, kind, type(key).__name__))
    if not key:
        raise ValueError("gpurun.%s: empty %s" % (what, kind))
    if "\0" in key:
        raise ValueError("gpurun.%s: %s %r holds a NUL character" % (what, kind, key[:32]))
    try:
        b = key.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("gpurun.%s: %s %r is not UTF-8 text" % (what, kind, key[:32])) from None
    if len(b) > limit:
        raise ValueError("gpurun.%s: %s '%s...' of %d bytes is over the limit of %d"
                         % (what, kind, key[:32], len(b), limit))
    return b


def _check_timeout(what, timeout):
    """Seconds as a float (None: no limit), or TypeError/ValueError."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
        raise TypeError("gpurun.%s: timeout must be a number of seconds or None, not %s"
                        % (what, type(timeout).__name__))
    t = float(timeout)
    if not (t >= 0) or math.isinf(t):
        raise ValueError("gpurun.%s: timeout %r is not a finite number of seconds >= 0"
                         % (what, timeout))
    return t


def _ms(seconds):
    """A positive wait in whole milliseconds, at least 1."""
    return max(1, int(round(seconds * 1000))) if seconds > 0 else 0


# --- progress ---------------------------------------------------------------------------------


def _caller():
    """'file.py:42' of the first frame outside this package."""
    here = os.path.dirname(os.path.abspath(__file__))
    f = sys._getframe(1)
    while f is not None and os.path.dirname(os.path.abspath(f.f_code.co_filename)) == here:
        f = f.f_back
    if f is None:
        return "?"
    return "%s:%d" % (os.path.basename(f.f_code.co_filename), f.f_lineno)


def _int_arg(name, v):
    """An integer argument as int: ints and integral floats, never a bool."""
    if isinstance(v, bool) or v is None or isinstance(v, (str, bytes)):
        raise TypeError("gpurun.report: %s must be an integer, not %s" % (name, type(v).__name__))
    if isinstance(v, float):
        if not v.is_integer():
            raise TypeError("gpurun.report: %s must be an integer, not %r" % (name, v))
        v = int(v)
    else:
        try:
            v = operator.index(v)
        except TypeError:
            raise TypeError("gpurun.report: %s must be an integer, not %s"
                            % (name, type(v).__name__)) from None
    if not _INT64_MIN <= v <= _INT64_MAX:
        raise ValueError("gpurun.report: %s %d is out of the 64-bit range" % (name, v))
    return v


# The progress record's fields: a copy of lib/proto.h's PROGRESS_FIELDS, which the C library
# reads (tests/python/test_gpurun.py holds the two, and report()'s keywords, to each other).
# Each: the key, its kind ("I" an integer, "F" a number), whether a report must have it, and
# its range: "any", "nonneg" (0 or more: a count, a rate, a norm) or "pos" (more than 0: a
# duration, where 0 is unknown). A number below its range is a bug of the caller's
# arithmetic, not a value status should show: left out, with a warning; an integer out of its
# range raises ValueError.
_PROGRESS_FIELDS = (
    ("step", "I", True, "nonneg"),
    ("loss", "F", False, "any"),
    ("lr", "F", False, "any"),
    ("tokens_per_s", "F", False, "nonneg"),
    ("grad_norm", "F", False, "nonneg"),
    ("total_steps", "I", False, "nonneg"),
    ("step_time", "F", False, "pos"),
)


def _number(name, v, rng, bad):
    """A float for the wire, or None to leave it out: None stays None (not known), and a
    non-finite number, or a negative one where its range rng has none, is left out too:
    (its kind, the warning's text) goes to bad. A 0 of range "pos" is unknown: left out
    quietly."""
    if v is None:
        return None
    if isinstance(v, (bool, str, bytes)):
        raise TypeError("gpurun.report: %s must be a number, not %s" % (name, type(v).__name__))
    try:
        f = float(v)
    except (TypeError, ValueError):
        raise TypeError("gpurun.report: %s must be a number, not %s"
                        % (name, type(v).__name__)) from None
    if not math.isfinite(f):
        bad.append(("%s %s" % (name, f), "%s is %s" % (name, f)))
        return None
    if f < 0 and rng != "any":
        bad.append(("%s negative" % name, "%s is %g (negative)" % (name, f)))
        return None
    if f == 0 and rng == "pos":
        return None
    return f


def report(step, *, loss=None, lr=None, tokens_per_s=None, grad_norm=None, total_steps=None,
           step_time=None):
    """Sends this rank's progress at step (what `gpurun status` shows, and what the job's
    hang detection watches). total_steps: the steps the run aims at (progress bar and ETA);
    None leaves what an earlier report said. step_time: seconds the step's own work took,
    without waiting on the other ranks (say, before the gradients' allreduce): what names a
    straggler under data parallelism, where every rank's steps take the slowest one's time;
    0 is unknown. Never waits, never raises for the agent's sake; raises TypeError for
    arguments that are not numbers, ValueError for a negative step or total_steps."""
    global _warned, _conn
    given = locals()
    bad = []
    msg = {"type": "report"}
    # A number not known (None, or not finite) is left out: status shows it as unknown.
    for key, kind, required, rng in _PROGRESS_FIELDS:
        v = given[key]
        if kind == "I":
            if v is None and not required:
                continue
            v = _int_arg(key, v)
            if v < 0 or (v == 0 and rng == "pos"):
                raise ValueError("gpurun.report: %s %d is %s" % (
                    key, v, "negative" if v < 0 else "not above 0"))
        else:
            v = _number(key, v, rng, bad)
            if v is None:
                continue
        msg[key] = v
    # Outside a job the call is a quiet no-op: the argument checks above still apply. Each
    # kind once per process ("loss is nan", "loss is inf"...): a diverged run reports the
    # same one every step.
    new = [text for kind, text in bad if kind not in _warned]
    if new and in_job():
        _warned.update(kind for kind, _ in bad)
        try:
            for text in new:
                sys.stderr.write("gpurun.report: %s: %s: not reported\n" % (_caller(), text))
            sys.stderr.flush()
        except (OSError, ValueError, AttributeError):
            pass
    if not in_job() or _finalized:
        return
    try:
        # A report waits for no one: not for a thread that holds the lock for long either.
        if not _link.acquire(timeout=0.05):
            return
    except _link.Reentered:
        return
    try:
        if _conn is None and not _finalized:
            _conn = _link.Link(_the_place())
        if _conn is not None and not _finalized:
            _conn.send_report(msg)
    except Error:
        pass
    finally:
        _link.release()


# --- the store --------------------------------------------------------------------------------


def _value_bytes(value):
    if isinstance(value, str):
        try:
            return value.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError("gpurun.set: the str value is not UTF-8 text") from None
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise TypeError("gpurun.set: value must be bytes or str, not %s" % type(value).__name__)


def set(key, value):
    """Stores value (bytes, or a str as its UTF-8) under key, replacing any earlier value.
    Every rank of the job reads it with get(key). It returns once the node's agent has taken
    it, before the node's every later request: a get or barrier after it sees it; a rank
    elsewhere told by other means may need a get that waits. A value the job's store cannot
    keep (full) fails the job."""
    _check_key("set", key)
    data = _value_bytes(value)
    if len(data) > VALUE_MAX:
        raise ValueError("gpurun.set: value of %d bytes for '%s' is over the store's limit of %d"
                         % (len(data), key, VALUE_MAX))
    if not in_job():
        return None
    with _Locked("set") as c:
        c.request({"type": "kv_put", "key": key, "value": _link.b64encode(data)},
                  _link.REQUEST_TIMEOUT, "kv_put", key)
    return None


def get(key, timeout=None):
    """The value of key as bytes, waiting for it to exist: timeout None waits as long as the
    job lives, 0 does not wait (KeyError when the key is missing), a number of seconds
    raises gpurun.TimeoutError when it runs out. None outside a job."""
    _check_key("get", key)
    t = _check_timeout("get", timeout)
    if not in_job():
        return None
    wait_ms = _link.WAIT_FOREVER_MS if t is None else _ms(t)
    with _Locked("get") as c:
        while True:
            try:
                m = c.request({"type": "kv_get", "key": key, "timeout_ms": wait_ms},
                              wait_ms / 1000.0 + _link.REPLY_GRACE, "kv_get", key)
                break
            except _link.NotFound:
                raise KeyError(key) from None
            except TimeoutError:
                if t is None and c.dead is None:
                    continue
                # An agent may say "timeout" for a key missing when asked not to wait.
                if t is not None and wait_ms == 0 and c.dead is None:
                    raise KeyError(key) from None
                raise
        value = _link.b64decode(m["value"])
        if value is None:
            raise c.broken("kv_get '%s': agent sent a value that is not base64" % key)
    return value


def delete(key):
    """Removes key from the store; removing a missing key is not an error."""
    _check_key("delete", key)
    if not in_job():
        return None
    with _Locked("delete") as c:
        c.request({"type": "kv_del", "key": key}, _link.REQUEST_TIMEOUT, "kv_del", key)
    return None


def barrier(name=None, timeout=None):
    """Returns once every rank of the job has called barrier with the same name; None takes
    the next name of the implicit sequence "#0", "#1"... (the C library's, counted per
    process). Names starting with '#' are reserved for it (ValueError). timeout: seconds,
    None for no limit; gpurun.TimeoutError when it runs out (the barrier stays counted)."""
    if name is not None:
        _check_key("barrier", name, "name", NAME_MAX)
        if name.startswith("#"):
            raise ValueError("gpurun.barrier: name '%s' starts with '#', reserved for the "
                             "implicit sequence" % name)
    t = _check_timeout("barrier", timeout)
    if not in_job():
        return None
    with _Locked("barrier") as c:
        if name is None:
            name = "#%d" % c.barrier_seq
            c.barrier_seq += 1
        try:
            c.request({"type": "barrier", "name": name}, t, "barrier", name)
        except TimeoutError:
            if c.dead is not None:
                raise
            raise TimeoutError("barrier '%s': not every rank arrived within %d ms"
                               % (name, _ms(t))) from None
    return None


# --- the pre-timeout signal -------------------------------------------------------------------


def _preempt_signal():
    env = os.environ.get("GPURUN_PREEMPT_SIGNAL", "")
    if not env:
        return int(_signal.SIGUSR1)
    if not (env.isascii() and env.isdigit()) or not 1 <= int(env) <= 64:
        raise Error("GPURUN_PREEMPT_SIGNAL '%s' is not a signal number" % env)
    return int(env)


def _on_signal(signum, frame):
    global _preempted
    # The agent signals the rank's whole process group: a child forked from the rank (a
    # DataLoader worker) inherits this handler, and the signal is not for it.
    if os.getpid() != _preempt_pid:
        return
    _preempted = True
    cb = _preempt_callback
    if cb is not None:
        cb(signum)


def on_preempt(callback=None):
    """Installs the pre-timeout signal's handler (it records the request, then calls
    callback(signum) when a callback is given), then asks the agent for the signal. Call it
    from the main thread. Returns the signal's number; None outside a job."""
    global _preempt_callback, _preempt_pid
    if callback is not None and not callable(callback):
        raise TypeError("gpurun.on_preempt: callback must be callable, not %s"
                        % type(callback).__name__)
    if not in_job():
        return None
    if threading.current_thread() is not threading.main_thread():
        raise ValueError("gpurun.on_preempt: call it from the main thread (Python runs signal "
                         "handlers there)")
    sig = _preempt_signal()
    _preempt_callback = callback
    _preempt_pid = os.getpid()
    _signal.signal(sig, _on_signal)
    with _Locked("on_preempt") as c:
        c.request({"type": "preempt"}, _link.REQUEST_TIMEOUT, "preempt", c.place.sock)
    return sig


def preempt_requested():
    """Whether the pre-timeout signal came (after on_preempt())."""
    return _preempted


# --- regrouping in process -------------------------------------------------------------------


def generation():
    """This rank's generation: restart_count() at the start, then the one the last regroup()
    returned. Every rank of a generation shares it (a spare's new rank starts in it)."""
    return restart_count() if _generation is None else _generation


def regroup_enable():
    """Says that this rank can go on after a peer's loss (see regroup()): when a node is
    lost and every rank of the other nodes said so, and a spare covers the loss, the job
    regroups in process instead of restarting every rank. Once per process; None outside a
    job."""
    if not in_job():
        return None
    with _Locked("regroup_enable") as c:
        c.request({"type": "regroup_ok"}, _link.REQUEST_TIMEOUT, "regroup_ok", c.place.sock)
    return None


def regroup(timeout=300):
    """Called once this rank's collectives failed (a peer gone): waits up to timeout seconds
    (None: no limit) until the leader names the next generation in which this rank goes on,
    and returns it. The store is then the new generation's (empty) and the implicit barrier
    names count from "#0" again, as in the spare's new ranks. gpurun.Aborted where the job
    does not regroup (it is torn down, a rank restarts every rank instead),
    gpurun.TimeoutError where no generation came in time. Outside a job: gpurun.Error."""
    global _generation
    t = _check_timeout("regroup", timeout)
    if not in_job():
        raise Error("regroup: not in a gpurun job (no agent to regroup with)")
    gen = generation()
    with _Locked("regroup") as c:
        m = c.request({"type": "regroup", "generation": gen}, t, "regroup", "generation %d" % gen)
        if m["generation"] <= gen:
            raise c.broken("regroup: the agent named generation %d, not one after %d"
                           % (m["generation"], gen))
        _generation = m["generation"]
        c.barrier_seq = 0
    return _generation


# --- the end ----------------------------------------------------------------------------------


def _finalize(timeout):
    global _finalized
    if not in_job() or _finalized:
        return None
    try:
        _link.acquire()
    except _link.Reentered:
        raise Error("gpurun.finalize: called from a signal handler while this thread was "
                    "inside gpurun") from None
    try:
        if _finalized:
            return None
        _finalized = True
        c = _conn
        if c is None or c.sock is None or c.dead is not None:
            return None
        try:
            c.request({"type": "finalize"}, timeout, "finalize", c.place.sock)
        finally:
            c.close()
    finally:
        _link.release()
    return None


def finalize():
    """Tells the agent this rank is done with the library and closes the connection. Later
    requests raise Error; reports are dropped. Nothing to do for a process that never talked
    to the agent, or whose link is gone already."""
    _finalize(_link.REQUEST_TIMEOUT)


@atexit.register
def _finalize_at_exit():
    try:
        _finalize(_EXIT_FINALIZE_TIMEOUT)
    except Exception:  # an exit goes on whatever the agent says
        pass
