"""A fake rendezvousd agent for the gpurun module's unit tests: a Unix-socket server in a
thread that speaks the rank link of lib/proto.h (4-byte big-endian length + JSON), records
every frame it gets and answers as the real agent and leader do, unless a test overrides an
answer: `agent.answer["kv_get"] = fn(conn, msg)` returns the replies to send (dicts, or raw
bytes sent as they are), or None to send nothing."""

import base64
import json
import os
import socket
import struct
import tempfile
import threading
import time

HDR = struct.Struct(">I")


def frame(obj):
    body = json.dumps(obj, separators=(",", ":")).encode("utf-8")
    return HDR.pack(len(body)) + body


class Conn:
    """One rank connection: its frames as they came (raw bytes and decoded)."""

    def __init__(self, agent, sock):
        self.agent = agent
        self.sock = sock
        self.raw = []
        self.msgs = []
        self.closed = False

    def send(self, item):
        data = item if isinstance(item, (bytes, bytearray)) else frame(item)
        try:
            self.sock.sendall(data)
        except OSError:
            pass

    def close(self):
        self.closed = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


class FakeAgent:
    def __init__(self, token="ab" * 16):
        self.dir = tempfile.mkdtemp(prefix="gpurun-fake-")
        self.path = os.path.join(self.dir, "agent.sock")
        self.token = token
        self.store = {}
        self.conns = []
        self.answer = {}
        self.reading = threading.Event()  # cleared: connections stop reading (a stuck agent)
        self.reading.set()
        self.cv = threading.Condition()
        self.srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.srv.bind(self.path)
        self.srv.listen(16)
        self.stopped = False
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    # --- what the tests look at ------------------------------------------------------------

    def msgs(self, type_=None):
        """Every decoded frame of every connection, in order of arrival per connection."""
        with self.cv:
            out = [m for c in self.conns for m in c.msgs]
        return [m for m in out if type_ is None or m.get("type") == type_]

    def wait_for(self, pred, timeout=5.0, what="a frame"):
        """Waits until pred() is true; AssertionError naming what otherwise."""
        end = time.monotonic() + timeout
        with self.cv:
            while not pred():
                left = end - time.monotonic()
                if left <= 0:
                    raise AssertionError("fake agent: no %s within %.1f s; frames: %r"
                                         % (what, timeout, [m for c in self.conns
                                                            for m in c.msgs][-10:]))
                self.cv.wait(left)

    def stop(self):
        self.stopped = True
        try:
            self.srv.close()
        except OSError:
            pass
        for c in list(self.conns):
            if not c.closed:
                c.close()
        try:
            os.unlink(self.path)
        except OSError:
            pass
        try:
            os.rmdir(self.dir)
        except OSError:
            pass

    # --- the server ------------------------------------------------------------------------

    def _accept(self):
        while not self.stopped:
            try:
                s, _ = self.srv.accept()
            except OSError:
                return
            c = Conn(self, s)
            with self.cv:
                self.conns.append(c)
                self.cv.notify_all()
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def _serve(self, c):
        buf = b""
        while True:
            self.reading.wait()
            try:
                chunk = c.sock.recv(65536)
            except OSError:
                break
            if not chunk:
                break
            buf += chunk
            while len(buf) >= 4:
                (n,) = HDR.unpack_from(buf)
                if len(buf) < 4 + n:
                    break
                body, buf = buf[4:4 + n], buf[4 + n:]
                try:
                    m = json.loads(body)
                except ValueError:
                    m = {"type": "?garbage", "body": body.decode("latin-1")}
                with self.cv:
                    c.raw.append(body)
                    c.msgs.append(m)
                    self.cv.notify_all()
                replies = self._answer(c, m)
                for r in replies or []:
                    c.send(r)
                if c.closed:
                    return
        c.closed = True

    def _answer(self, c, m):
        t = m.get("type")
        fn = self.answer.get(t)
        if fn is not None:
            return fn(c, m)
        mid = m.get("id", 0)
        if t == "hello":
            if m.get("token") != self.token:
                c.send({"type": "error", "id": 0, "code": "denied", "msg": "wrong rank or token"})
                c.close()
                return None
            return [{"type": "ok", "id": 0}]
        if t == "kv_put":
            self.store[m["key"]] = m["value"]
            return [{"type": "ok", "id": mid}]
        if t == "kv_get":
            if m["key"] in self.store:
                return [{"type": "kv_val", "id": mid, "value": self.store[m["key"]]}]
            if m["timeout_ms"] == 0:
                return [{"type": "error", "id": mid, "code": "not_found", "msg": "no such key"}]
            time.sleep(min(m["timeout_ms"], 200) / 1000.0)
            return [{"type": "error", "id": mid, "code": "timeout",
                     "msg": "key '%s' did not appear in time" % m["key"]}]
        if t == "kv_del":
            self.store.pop(m["key"], None)
            return [{"type": "ok", "id": mid}]
        if t in ("barrier", "preempt", "finalize"):
            return [{"type": "ok", "id": mid}]
        if t == "report":
            return None
        return [{"type": "error", "id": mid, "code": "bad_request", "msg": "not a rank request"}]


def b64(data):
    return base64.b64encode(data).decode("ascii")
