"""The connection of one process to its node's rendezvousd: framing, requests and replies.

The wire is lib/proto.h's rank link, the same bytes lib/rank/gr.c sends: a 4-byte big-endian
length, then one compact JSON object. Everything here runs under the one lock of the module
(LOCK), which is never held while waiting: the thread whose reply is awaited polls the socket
with the lock released, and any thread that reads the socket hands out what it read (a reply
to another thread's request, a heartbeat, a late reply to a request given up on).
"""

import base64
import binascii
import builtins
import json
import os
import select
import socket
import struct
import threading
import time

# The store's limits, as lib/rank/gr.h has them (GR_KEY_MAX, GR_NAME_MAX, GR_VALUE_MAX): a key
# and a barrier name are at most 256 bytes of UTF-8; a value travels as base64 in at most
# 256 KiB, so it holds at most 196608 bytes.
KEY_MAX = 256
NAME_MAX = 256
VALUE_MAX = 3 * (256 * 1024) // 4
# The longest frame the agent accepts and sends (lib/frame.h FRAME_MAX_DEFAULT).
FRAME_MAX = 1 << 20
# How long a request that waits for nobody (kv_put, kv_del, preempt, finalize) may go
# unanswered before the agent is taken for stuck: lib/rank/gr.c's GR_REQUEST_TIMEOUT_MS.
REQUEST_TIMEOUT = 120.0
# Time the agent gets to deliver a kv_get's answer after the wait it was asked for ran out
# (the leader's timer, the hop to the agent): lib/rank/gr.c's GR_REPLY_GRACE_MS.
REPLY_GRACE = 10.0
# The wait a kv_get asks for when the caller set no limit (a day); when it runs out the
# request is made again, so that the wait really is unbounded: GR_WAIT_FOREVER_MS.
WAIT_FOREVER_MS = 24 * 3600 * 1000
# Requests given up on whose late replies are skipped (GR_ABANDONED_MAX).
ABANDONED_MAX = 16
# Longest GPURUN_TOKEN accepted: hex of up to 128 bytes (the agent uses 32).
TOKEN_MAX = 256
# Longest Unix socket path (sun_path less its NUL).
SOCK_PATH_MAX = 107
# Bytes read from the socket at a time.
READ_CHUNK = 64 * 1024
# A waiting thread looks at the socket's output again at least this often, so that frames
# queued by report() behind a full socket buffer go out while it waits.
POLL_SLICE = 1.0
# Reports queued behind a slow agent, in bytes, beyond which a report is dropped (the next
# one carries newer numbers anyway); a report's frame is about 200 bytes.
REPORT_BACKLOG_MAX = 64 * 1024

_HDR = struct.Struct(">I")
# The one lock of the module: it guards the link, its buffers and its counters. HOLDER is the
# thread that holds it (None while it is free or released for a wait): a call from a signal
# handler that interrupted its own thread inside the module must fail, not deadlock.
LOCK = threading.Lock()
COND = threading.Condition(LOCK)
HOLDER = None


class Reentered(Exception):
    """Internal: this thread already holds LOCK (a signal handler calling in)."""


def acquire(timeout=-1):
    """Takes LOCK; False when timeout (seconds) ran out first. Raises Reentered when this
    thread holds it already."""
    global HOLDER
    me = threading.get_ident()
    if HOLDER == me:
        raise Reentered()
    if not LOCK.acquire(timeout=timeout):
        return False
    HOLDER = me
    return True


def release():
    global HOLDER
    HOLDER = None
    LOCK.release()


def wait(timeout):
    """COND.wait with HOLDER kept true."""
    global HOLDER
    HOLDER = None
    try:
        COND.wait(timeout)
    finally:
        HOLDER = threading.get_ident()


def reset_after_fork():
    """In a child after fork: a fresh lock (another thread of the parent may have held it)."""
    global LOCK, COND, HOLDER
    LOCK = threading.Lock()
    COND = threading.Condition(LOCK)
    HOLDER = None


class Error(RuntimeError):
    """A request failed: the agent refused it, the link broke, or an answer made no sense.
    The text names the request, its subject and why, as lib/rank/gr.c's gr_strerror does."""


class TimeoutError(Error, builtins.TimeoutError):
    """A wait ran out: a get whose key did not appear, a barrier some rank never reached."""


class Aborted(Error):
    """The job is being torn down: a regroup or a barrier that will never complete."""


class NotFound(Error):
    """A get with timeout 0 found no such key (turned into KeyError by the API)."""


class Expired(Exception):
    """Internal: a wait's deadline passed before its reply came."""


# The agent's error codes (lib/proto.h): those that refuse one request; any other code
# ("bad_request") means the link is out of step, and it is given up, as lib/rank/gr.c does.
_ERROR_CODES = {
    "timeout": TimeoutError,
    "not_found": NotFound,
    "too_large": Error,
    "aborted": Aborted,
    "denied": Error,
    "no_space": Error,
    "bad_name": Error,
    "unsupported": Error,
}

# The reply a request is owed where it is not "ok".
_REPLY_TO = {"kv_get": "kv_val", "mem_load": "mem_copy", "regroup": "regroup"}

# A reply's fields, one row per type (strict, as the agent's json_unpack formats are).
_REPLY_FIELDS = {
    "ok": {"type": str, "id": int},
    "kv_val": {"type": str, "id": int, "value": str},
    "mem_copy": {"type": str, "id": int, "path": str, "step": int, "size": int},
    "regroup": {"type": str, "id": int, "generation": int},
    "error": {"type": str, "id": int, "code": str, "msg": str},
}


def errtext(err):
    """strerror in the grammar of our messages: "connection refused"."""
    text = os.strerror(err.errno) if getattr(err, "errno", None) else str(err)
    if text[:1].isupper() and not text[1:2].isupper():
        text = text[0].lower() + text[1:]
    return text


def env_int(name, minimum):
    """A decimal number of the environment, digits only, in [minimum, 2**31 - 1]."""
    s = os.environ.get(name)
    if s is None:
        raise Error("'%s' is not set: not started by rendezvousd" % name)
    if not s:
        raise Error("'%s' is empty: expected a number" % name)
    if not s.isascii() or not s.isdigit():
        raise Error("'%s' is '%.64s': expected a decimal number" % (name, s))
    v = int(s)
    if v > 2**31 - 1:
        raise Error("'%s' is '%.64s': out of range" % (name, s))
    if v < minimum:
        raise Error("'%s' is %d: must be at least %d" % (name, v, minimum))
    return v


class Place:
    """This rank's place and credentials, from the environment rendezvousd gave it, checked
    as gr_init checks them."""

    def __init__(self):
        sock = os.environ.get("GPURUN_SOCK")
        if sock is None:
            raise Error("'GPURUN_SOCK' is not set: not started by rendezvousd")
        if not sock or len(os.fsencode(sock)) > SOCK_PATH_MAX:
            raise Error("'GPURUN_SOCK' is not a socket path of 1..%d bytes" % SOCK_PATH_MAX)
        self.sock = sock
        self.rank = env_int("RANK", 0)
        self.world_size = env_int("WORLD_SIZE", 1)
        self.local_rank = env_int("LOCAL_RANK", 0)
        self.local_world_size = env_int("LOCAL_WORLD_SIZE", 1)
        self.node_rank = env_int("NODE_RANK", 0)
        token = os.environ.get("GPURUN_TOKEN")
        if token is None:
            raise Error("'GPURUN_TOKEN' is not set: not started by rendezvousd")
        if not token or len(token) > TOKEN_MAX or len(token) % 2:
            raise Error("'GPURUN_TOKEN' has %d characters: expected hex digits" % len(token))
        for i, c in enumerate(token):
            if c not in "0123456789abcdefABCDEF":
                raise Error("'GPURUN_TOKEN' is not hex (character %d)" % i)
        self.token = token
        if self.rank >= self.world_size:
            raise Error("'RANK' is %d: not below 'WORLD_SIZE' %d" % (self.rank, self.world_size))
        if self.local_rank >= self.local_world_size:
            raise Error("'LOCAL_RANK' is %d: not below 'LOCAL_WORLD_SIZE' %d"
                        % (self.local_rank, self.local_world_size))
        if self.local_world_size > self.world_size:
            raise Error("'LOCAL_WORLD_SIZE' %d is above 'WORLD_SIZE' %d"
                        % (self.local_world_size, self.world_size))


def encode(msg):
    """One frame: the length, then the compact JSON of msg."""
    body = json.dumps(msg, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False).encode("utf-8")
    if len(body) > FRAME_MAX:
        raise Error("'%s': frame of %d bytes is over the limit of %d"
                    % (msg.get("type"), len(body), FRAME_MAX))
    return _HDR.pack(len(body)) + body


def b64encode(value):
    return base64.b64encode(value).decode("ascii")


def b64decode(text):
    """Strict base64 (whole quads of the alphabet, '=' only at the end), or None."""
    if len(text) % 4:
        return None
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError, ValueError):
        return None


class Link:
    """One connection to the agent, owned by the process that opened it. Every method is
    called with LOCK held; the waits release it."""

    def __init__(self, place):
        self.place = place
        self.sock = None
        self.pid = os.getpid()
        self.next_id = 1
        self.barrier_seq = 0
        self.abandoned = []
        self.waiting = set()
        self.replies = {}
        self.reader = None  # the thread ident polling the socket, or None
        self.dead = None  # the text of the failure that made the link unusable
        self.hello_pending = False
        self.inbuf = bytearray()
        self.outbuf = bytearray()

    # --- the socket ----------------------------------------------------------------------

    def broken(self, text):
        """The link is unusable from now on (the stream may be out of step): every later
        request raises Error(text)."""
        if self.dead is None:
            self.dead = text
        if self.sock is not None:
            try:
                self.sock.close()
            except OSError:
                pass
            self.sock = None
        COND.notify_all()
        return Error(self.dead)

    def open(self, deadline):
        """Connects and sends the hello without waiting for its answer: the first reply on
        the link is the hello's (id 0), read with the first request's. A report therefore
        never waits for the agent, and a refused hello fails the next request. deadline
        (time.monotonic(), or None for a report) bounds a connect the agent's backlog holds
        up; a report gives up at once and tries again with the next one."""
        if self.sock is not None or self.dead is not None:
            return
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.setblocking(False)
        while True:
            try:
                s.connect(self.place.sock)
                break
            except (BlockingIOError, InterruptedError):
                # A full listen backlog: the agent is busy accepting others.
                if deadline is None or time.monotonic() >= deadline:
                    s.close()
                    raise Expired()
                time.sleep(0.01)
            except OSError as e:
                s.close()
                raise self.broken("cannot connect to agent '%s': %s"
                                  % (self.place.sock, errtext(e)))
        self.sock = s
        self.hello_pending = True
        self.outbuf += encode({"type": "hello", "rank": self.place.rank,
                               "token": self.place.token})
        self.flush()

    def flush(self):
        """Writes what the socket takes now of the queued frames, without waiting."""
        while self.outbuf and self.sock is not None:
            try:
                n = self.sock.send(self.outbuf)
            except (BlockingIOError, InterruptedError):
                return
            except (BrokenPipeError, ConnectionResetError):
                # An agent that refused the hello said why before closing: read it.
                if self.hello_pending:
                    self.receive()
                raise self.broken("agent '%s' closed the connection" % self.place.sock)
            except OSError as e:
                raise self.broken("cannot send to agent '%s': %s" % (self.place.sock, errtext(e)))
            del self.outbuf[:n]

    def receive(self):
        """Reads what the socket has and hands out every whole frame in it."""
        while self.sock is not None:
            try:
                chunk = self.sock.recv(READ_CHUNK)
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionResetError:
                chunk = b""
            except OSError as e:
                raise self.broken("cannot read from agent '%s': %s"
                                  % (self.place.sock, errtext(e)))
            if not chunk:
                raise self.broken("agent '%s' closed the connection" % self.place.sock)
            self.inbuf += chunk
            while len(self.inbuf) >= _HDR.size:
                (n,) = _HDR.unpack_from(self.inbuf)
                if n == 0 or n > FRAME_MAX:
                    raise self.broken("bad frame from agent '%s': %s" % (
                        self.place.sock, "empty" if n == 0 else "longer than the limit"))
                if len(self.inbuf) < _HDR.size + n:
                    break
                body = bytes(self.inbuf[_HDR.size:_HDR.size + n])
                del self.inbuf[:_HDR.size + n]
                self.dispatch(body)

    def dispatch(self, body):
        """One frame from the agent: a heartbeat, the hello's answer, a late reply to a
        request given up on, or the reply a waiting request is owed."""
        sock = self.place.sock
        try:
            m = json.loads(body.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as e:
            raise self.broken("garbage from agent '%s': %s" % (sock, e))
        t = m.get("type") if isinstance(m, dict) else None
        if t == "hb" and len(m) == 1:
            return
        fields = _REPLY_FIELDS.get(t) if isinstance(t, str) else None
        if fields is None or set(m) != set(fields) or any(
                type(m[k]) is not v for k, v in fields.items()):
            raise self.broken("garbage from agent '%s': not a reply: %.200s"
                              % (sock, body.decode("utf-8", "replace")))
        rid = m["id"]
        if self.hello_pending and rid == 0:
            self.hello_pending = False
            if t == "error":
                raise self.broken("hello '%s': agent refused with '%s': %s"
                                  % (sock, m["code"], m["msg"]))
            if t != "ok":
                raise self.broken("hello '%s': agent answered '%s' instead of 'ok'" % (sock, t))
            return
        if rid in self.abandoned:
            self.abandoned.remove(rid)
            return
        if rid not in self.waiting:
            raise self.broken("unexpected '%s' (id %d) from agent '%s'" % (t, rid, sock))
        self.replies[rid] = m

    def pump(self, deadline):
        """Waits (LOCK released) until the socket has something, the deadline or POLL_SLICE
        passes, then reads it and hands it out."""
        s = self.sock
        timeout = POLL_SLICE
        if deadline is not None:
            timeout = min(timeout, max(0.0, deadline - time.monotonic()))
        events = select.POLLIN | (select.POLLOUT if self.outbuf else 0)
        p = select.poll()
        p.register(s.fileno(), events)
        release()
        try:
            ready = p.poll(int(timeout * 1000) + 1)
        finally:
            acquire()
        if self.sock is not s or not ready:
            return
        ev = ready[0][1]
        if ev & select.POLLOUT:
            self.flush()
        if ev & (select.POLLIN | select.POLLHUP | select.POLLERR):
            self.receive()

    # --- requests ------------------------------------------------------------------------

    def await_reply(self, rid, deadline):
        """Waits for the reply to rid: as the reader when no other thread reads, else until
        the reader hands it over."""
        me = threading.get_ident()
        while True:
            if rid in self.replies:
                return self.replies.pop(rid)
            if self.dead is not None:
                raise Error(self.dead)
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                raise Expired()
            if self.reader is not None:
                wait(None if deadline is None else deadline - now)
                continue
            self.reader = me
            try:
                self.pump(deadline)
            finally:
                self.reader = None
                COND.notify_all()

    def request(self, msg, timeout, what, subject):
        """Sends msg (its id set here) and waits up to timeout seconds (None: no limit) for
        its reply. Returns the reply (ok or kv_val); raises Error, TimeoutError or NotFound
        with a text naming what and subject."""
        if self.dead is not None:
            raise Error(self.dead)
        if self.reader == threading.get_ident():
            raise Error("%s '%s': called while this thread waits for the agent (from a "
                        "signal handler?)" % (what, subject))
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            self.open(time.monotonic() + REQUEST_TIMEOUT if deadline is None else deadline)
        except Expired:
            raise TimeoutError("%s '%s': agent '%s' accepted no connection in time"
                               % (what, subject, self.place.sock)) from None
        rid = self.next_id
        self.next_id += 1
        msg["id"] = rid
        frame = encode(msg)
        self.waiting.add(rid)
        try:
            self.outbuf += frame
            self.flush()
            try:
                m = self.await_reply(rid, deadline)
            except Expired:
                if len(self.abandoned) == ABANDONED_MAX:
                    self.abandoned.pop(0)
                self.abandoned.append(rid)
                raise TimeoutError("%s '%s': no answer from agent '%s' within %d ms"
                                   % (what, subject, self.place.sock, round(timeout * 1000)))
        finally:
            self.waiting.discard(rid)
        if m["type"] == "error":
            cls = _ERROR_CODES.get(m["code"])
            if cls is None:
                raise self.broken("%s '%s': agent refused with '%s': %s"
                                  % (what, subject, m["code"], m["msg"]))
            raise cls("%s '%s': %s" % (what, subject, m["msg"]))
        want = _REPLY_TO.get(msg["type"], "ok")
        if m["type"] != want:
            raise self.broken("%s '%s': agent answered '%s' instead of '%s'"
                              % (what, subject, m["type"], want))
        return m

    def send_report(self, msg):
        """Queues one report and writes what the socket takes now; never waits. Returns
        whether it was queued (False: the agent is gone or far behind)."""
        if self.dead is not None:
            return False
        try:
            self.open(None)
        except (Expired, Error):
            return False
        if len(self.outbuf) > REPORT_BACKLOG_MAX:
            return False
        self.outbuf += encode(msg)
        try:
            self.flush()
        except Error:
            return False
        return True

    def close(self):
        if self.sock is not None:
            try:
                self.sock.close()
            except OSError:
                pass
            self.sock = None
        self.dead = self.dead or "the link was finalized"
        COND.notify_all()
