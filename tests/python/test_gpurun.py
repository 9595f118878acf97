"""Unit tests of the gpurun Python module against a fake agent (fake_agent.py): the wire
(framing, ids, base64 as lib/rank/gr.c writes it), the agent's errors, timeouts and late replies,
the checks made before sending, report()'s NaN and type handling and its never blocking, a
dead, garbage-speaking or refusing agent, threads, fork, the pre-timeout signal, finalize and
the atexit hook, and the no-op outside a job.

Run: python3 -m unittest discover -s tests/python (with lib/rank/python on PYTHONPATH)."""

import base64
import builtins
import inspect
import io
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import unittest
from contextlib import redirect_stderr

import gpurun
from gpurun import _link
from fake_agent import HDR, FakeAgent, b64

HERE = os.path.dirname(os.path.abspath(__file__))
PKG = os.path.dirname(os.path.dirname(os.path.abspath(gpurun.__file__)))
ENV_KEYS = ["GPURUN_SOCK", "GPURUN_TOKEN", "RANK", "WORLD_SIZE", "LOCAL_RANK",
            "LOCAL_WORLD_SIZE", "NODE_RANK", "GPURUN_JOB_ID", "GPURUN_JOB_DIR",
            "GPURUN_RESTART_COUNT", "GPURUN_PREEMPT_SIGNAL", "GROUP_RANK",
            "TORCHELASTIC_RESTART_COUNT"]


def reset_module():
    """A fresh process's state of the module (it keeps one link per process)."""
    if gpurun._conn is not None and gpurun._conn.sock is not None:
        gpurun._conn.sock.close()
    gpurun._conn = None
    gpurun._place = None
    gpurun._finalized = False
    gpurun._warned = set()
    gpurun._preempted = False
    gpurun._preempt_callback = None
    gpurun._preempt_pid = None
    gpurun._generation = None


def rank_env(agent, **extra):
    env = {"GPURUN_SOCK": agent.path if agent else "/nonexistent/agent.sock",
           "GPURUN_TOKEN": agent.token if agent else "ab" * 16, "RANK": "3",
           "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "NODE_RANK": "1",
           "GPURUN_JOB_ID": "local-test", "GPURUN_RESTART_COUNT": "2"}
    env.update(extra)
    return env


class Base(unittest.TestCase):
    def setUp(self):
        self.saved_env = {k: os.environ.get(k) for k in ENV_KEYS}
        for k in ENV_KEYS:
            os.environ.pop(k, None)
        reset_module()
        self.agent = None

    def tearDown(self):
        reset_module()
        if self.agent:
            self.agent.stop()
        for k, v in self.saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

    def start_agent(self, **extra):
        self.agent = FakeAgent()
        os.environ.update(rank_env(self.agent, **extra))
        return self.agent

    def expect_raises(self, exc, fn, *args, text=None, **kw):
        """fn(*args) raises exc (and its text holds text): the exception, or a failure
        saying what came instead."""
        try:
            fn(*args, **kw)
        except exc as e:
            if text is not None and text not in str(e):
                self.fail("%s raised %s(%r): expected the text to hold %r"
                          % (fn.__name__, type(e).__name__, str(e), text))
            return e
        except BaseException as e:
            self.fail("%s raised %s(%r), expected %s" % (fn.__name__, type(e).__name__, str(e),
                                                         exc.__name__))
        self.fail("%s returned, expected %s" % (fn.__name__, exc.__name__))


class Framing(Base):
    def test_hello_then_request_frames(self):
        a = self.start_agent()
        gpurun.set("k", b"v")
        conn = a.conns[0]
        hello, put = conn.msgs[0], conn.msgs[1]
        self.assertEqual(hello, {"type": "hello", "rank": 3, "token": a.token},
                         "first frame: expected the hello")
        self.assertEqual(put, {"type": "kv_put", "id": 1, "key": "k", "value": "dg=="})
        # Compact JSON, as lib/rank/gr.c sends it (JSON_COMPACT): no spaces.
        raw = conn.raw[1]
        self.assertNotIn(b" ", raw, "kv_put frame: expected compact JSON, got %r" % raw)

    def test_length_prefix_is_big_endian(self):
        a = self.start_agent()
        seen = []

        def record(c, m):
            seen.append(m)
            return [{"type": "ok", "id": m["id"]}]
        a.answer["kv_put"] = record
        value = os.urandom(1000)
        gpurun.set("big", value)
        body = a.conns[0].raw[1]
        want = len(json.dumps(seen[0], separators=(",", ":")))
        self.assertEqual(len(body), want, "frame length: got %d, expected %d" % (len(body), want))
        # The fake agent's framing is big-endian: the frame decoded at all proves the order;
        # check the header of a frame built here against struct's big-endian encoding too.
        frame = _link.encode({"type": "ok", "id": 7})
        self.assertEqual(frame[:4], HDR.pack(len(frame) - 4))
        self.assertEqual(frame[:4], (len(frame) - 4).to_bytes(4, "big"))

    def test_ids_increase(self):
        a = self.start_agent()
        gpurun.set("a", "1")
        gpurun.get("a")
        gpurun.delete("a")
        gpurun.barrier("b")
        ids = [m["id"] for m in a.msgs() if m["type"] != "hello"]
        self.assertEqual(ids, [1, 2, 3, 4], "request ids: got %r" % ids)
        types = [m["type"] for m in a.msgs()]
        self.assertEqual(types, ["hello", "kv_put", "kv_get", "kv_del", "barrier"])

    def test_one_connection_for_all_calls(self):
        a = self.start_agent()
        for i in range(5):
            gpurun.set("k%d" % i, b"x")
        gpurun.report(1)
        self.assertEqual(len(a.conns), 1, "connections: got %d, expected 1" % len(a.conns))
        self.assertEqual(len(a.msgs("hello")), 1)


class Base64(Base):
    def test_binary_value_round_trip(self):
        a = self.start_agent()
        value = bytes(range(256)) * 3 + b"\x00\xff"
        gpurun.set("bin", value)
        self.assertEqual(a.store["bin"], base64.b64encode(value).decode())
        got = gpurun.get("bin", timeout=0)
        self.assertEqual(got, value, "get: the bytes differ from those set")
        self.assertIsInstance(got, bytes)

    def test_known_vectors_as_openssl_encodes(self):
        # EVP_EncodeBlock: standard alphabet, '=' padding, no newlines.
        a = self.start_agent()
        for raw, text in [(b"", ""), (b"\x00", "AA=="), (b"\x00\xff", "AP8="),
                          (b"\x00\xff\x10", "AP8Q"), (b"\xfb\xff", "+/8=")]:
            gpurun.set("v", raw)
            self.assertEqual(a.store["v"], text, "base64 of %r: got %r, expected %r"
                             % (raw, a.store["v"], text))
            self.assertEqual(gpurun.get("v", timeout=0), raw)

    def test_str_value_is_utf8(self):
        a = self.start_agent()
        gpurun.set("s", "h\u00e9llo")
        self.assertEqual(base64.b64decode(a.store["s"]), "h\u00e9llo".encode())

    def test_value_a_c_rank_put(self):
        # What gr_example's rank 0 puts: 128 bytes with NUL and 0xff in them.
        a = self.start_agent()
        uid = bytes((i * 151 + 7) & 0xff for i in range(128))
        uid = uid[:5] + b"\x00\xff" + uid[7:]
        a.store["uid"] = b64(uid)
        self.assertEqual(gpurun.get("uid"), uid)

    def test_bad_base64_from_agent_breaks_the_link(self):
        a = self.start_agent()
        a.store["k"] = "not base64!"
        self.expect_raises(gpurun.Error, gpurun.get, "k", text="not base64")
        # The link is unusable: the next call fails the same way, without a new connection.
        self.expect_raises(gpurun.Error, gpurun.set, "x", b"1", text="not base64")
        self.assertEqual(len(a.conns), 1)

    def test_unpadded_base64_refused(self):
        a = self.start_agent()
        a.store["k"] = "AP8"
        self.expect_raises(gpurun.Error, gpurun.get, "k", text="not base64")


class Limits(Base):
    def test_key_limits(self):
        a = self.start_agent()
        gpurun.set("k" * 256, b"x")
        self.expect_raises(ValueError, gpurun.set, "k" * 257, b"x", text="over the limit of 256")
        # Bytes of UTF-8, not characters: 128 two-byte characters fit, 129 do not.
        gpurun.set("\u00e9" * 128, b"x")
        self.expect_raises(ValueError, gpurun.get, "\u00e9" * 129, text="258 bytes")
        self.expect_raises(ValueError, gpurun.set, "", b"x", text="empty key")
        self.expect_raises(ValueError, gpurun.set, "a\0b", b"x", text="NUL")
        self.expect_raises(ValueError, gpurun.set, "\udcff", b"x", text="not UTF-8")
        for bad in (1, b"k", None, 2.5):
            self.expect_raises(TypeError, gpurun.set, bad, b"x", text="key must be a str")
            self.expect_raises(TypeError, gpurun.get, bad, text="key must be a str")
            self.expect_raises(TypeError, gpurun.delete, bad, text="key must be a str")
        puts = [m["key"] for m in a.msgs("kv_put")]
        self.assertEqual(puts, ["k" * 256, "\u00e9" * 128], "only valid keys may be sent")

    def test_value_limits(self):
        a = self.start_agent()
        gpurun.set("max", b"\xab" * gpurun.VALUE_MAX)
        self.assertEqual(gpurun.VALUE_MAX, 196608)
        self.assertEqual(len(a.store["max"]), 256 * 1024, "the largest value fills 256 KiB")
        self.expect_raises(ValueError, gpurun.set, "over", b"\xab" * (gpurun.VALUE_MAX + 1),
                           text="196609 bytes")
        self.expect_raises(TypeError, gpurun.set, "k", 5, text="bytes or str")
        self.expect_raises(TypeError, gpurun.set, "k", None, text="bytes or str")
        self.assertNotIn("over", [m["key"] for m in a.msgs("kv_put")])

    def test_largest_value_read_back(self):
        self.start_agent()
        value = os.urandom(gpurun.VALUE_MAX)
        gpurun.set("max", value)
        self.assertEqual(gpurun.get("max", timeout=0), value)

    def test_barrier_names(self):
        a = self.start_agent()
        self.expect_raises(ValueError, gpurun.barrier, "#1", text="reserved")
        self.expect_raises(ValueError, gpurun.barrier, "", text="empty name")
        self.expect_raises(ValueError, gpurun.barrier, "b" * 257, text="over the limit")
        self.expect_raises(TypeError, gpurun.barrier, 5, text="name must be a str")
        self.expect_raises(TypeError, gpurun.barrier, "x", timeout="1", text="timeout")
        self.expect_raises(ValueError, gpurun.barrier, "x", timeout=-1, text="timeout")
        self.expect_raises(ValueError, gpurun.get, "x", timeout=float("nan"), text="timeout")
        self.assertEqual(a.msgs("barrier"), [])


class AgentErrors(Base):
    def test_error_reply_raises_with_the_agents_message(self):
        a = self.start_agent()
        a.answer["kv_put"] = lambda c, m: [{"type": "error", "id": m["id"], "code": "too_large",
                                            "msg": "the store is full"}]
        e = self.expect_raises(gpurun.Error, gpurun.set, "k", b"v")
        self.assertEqual(str(e), "kv_put 'k': the store is full")
        self.assertIsInstance(e, RuntimeError)
        # A refused request leaves the link usable.
        del a.answer["kv_put"]
        gpurun.set("k", b"v")
        self.assertEqual(len(a.conns), 1)

    def test_aborted(self):
        a = self.start_agent()
        a.answer["barrier"] = lambda c, m: [{"type": "error", "id": m["id"], "code": "aborted",
                                             "msg": "the job is being torn down"}]
        self.expect_raises(gpurun.Error, gpurun.barrier, "b", text="torn down")

    def test_bad_request_breaks_the_link(self):
        a = self.start_agent()
        a.answer["kv_del"] = lambda c, m: [{"type": "error", "id": m["id"],
                                            "code": "bad_request", "msg": "what is this"}]
        self.expect_raises(gpurun.Error, gpurun.delete, "k",
                           text="agent refused with 'bad_request': what is this")
        e = self.expect_raises(gpurun.Error, gpurun.set, "k", b"1")
        self.assertIn("bad_request", str(e), "later calls: expected the same error")

    def test_get_missing_key_without_wait(self):
        a = self.start_agent()
        self.expect_raises(KeyError, gpurun.get, "nope", timeout=0)
        self.assertEqual(a.msgs("kv_get")[-1]["timeout_ms"], 0)
        # An agent may say "timeout" for a key missing when asked not to wait.
        a.answer["kv_get"] = lambda c, m: [{"type": "error", "id": m["id"], "code": "timeout",
                                            "msg": "key 'nope' did not appear in time"}]
        self.expect_raises(KeyError, gpurun.get, "nope", timeout=0)

    def test_get_timeout(self):
        a = self.start_agent()
        e = self.expect_raises(gpurun.TimeoutError, gpurun.get, "nope", timeout=0.15,
                               text="did not appear in time")
        self.assertIsInstance(e, builtins.TimeoutError)
        self.assertIsInstance(e, gpurun.Error)
        self.assertEqual(a.msgs("kv_get")[-1]["timeout_ms"], 150)

    def test_get_without_limit_asks_again(self):
        a = self.start_agent()
        calls = []

        def answer(c, m):
            calls.append(m)
            if len(calls) < 3:
                return [{"type": "error", "id": m["id"], "code": "timeout", "msg": "not yet"}]
            return [{"type": "kv_val", "id": m["id"], "value": b64(b"late")}]
        a.answer["kv_get"] = answer
        self.assertEqual(gpurun.get("k"), b"late")
        self.assertEqual([m["timeout_ms"] for m in calls], [_link.WAIT_FOREVER_MS] * 3)

    def test_local_timeout_then_late_reply_skipped(self):
        a = self.start_agent()
        held = []
        a.answer["barrier"] = lambda c, m: held.append((c, m))
        t0 = time.monotonic()
        e = self.expect_raises(gpurun.TimeoutError, gpurun.barrier, "slow", timeout=0.2)
        self.assertEqual(str(e), "barrier 'slow': not every rank arrived within 200 ms")
        self.assertLess(time.monotonic() - t0, 2.0)
        # The late answer to the abandoned barrier comes before the next reply: skipped.
        c, m = held[0]
        c.send({"type": "ok", "id": m["id"]})
        gpurun.set("after", b"1")
        self.assertEqual(a.store["after"], b64(b"1"))

    def test_reply_with_unknown_id_breaks_the_link(self):
        a = self.start_agent()
        a.answer["kv_put"] = lambda c, m: [{"type": "ok", "id": 999}]
        self.expect_raises(gpurun.Error, gpurun.set, "k", b"1", text="unexpected 'ok' (id 999)")

    def test_wrong_reply_type(self):
        a = self.start_agent()
        a.answer["kv_get"] = lambda c, m: [{"type": "ok", "id": m["id"]}]
        self.expect_raises(gpurun.Error, gpurun.get, "k",
                           text="agent answered 'ok' instead of 'kv_val'")

    def test_implicit_barrier_names(self):
        a = self.start_agent()
        gpurun.barrier()
        gpurun.barrier("named")
        gpurun.barrier()
        names = [m["name"] for m in a.msgs("barrier")]
        self.assertEqual(names, ["#0", "named", "#1"], "barrier names: got %r" % names)


class Garbage(Base):
    def test_not_json(self):
        a = self.start_agent()
        a.answer["kv_put"] = lambda c, m: [HDR.pack(5) + b"hello"]
        self.expect_raises(gpurun.Error, gpurun.set, "k", b"1", text="garbage from agent")

    def test_frame_over_the_limit(self):
        a = self.start_agent()
        a.answer["kv_put"] = lambda c, m: [HDR.pack(0x7fffffff) + b"{"]
        self.expect_raises(gpurun.Error, gpurun.set, "k", b"1", text="longer than the limit")

    def test_unknown_field(self):
        a = self.start_agent()
        a.answer["kv_put"] = lambda c, m: [{"type": "ok", "id": m["id"], "extra": 1}]
        self.expect_raises(gpurun.Error, gpurun.set, "k", b"1", text="not a reply")

    def test_closed_socket(self):
        a = self.start_agent()
        gpurun.set("k", b"1")
        a.answer["kv_get"] = lambda c, m: c.close()
        self.expect_raises(gpurun.Error, gpurun.get, "k", text="closed the connection")
        self.expect_raises(gpurun.Error, gpurun.barrier, text="closed the connection")
        # report() never raises for a dead agent.
        gpurun.report(5, loss=1.0)

    def test_no_agent_at_all(self):
        os.environ.update(rank_env(None))
        gpurun.report(1, loss=0.5)
        self.expect_raises(gpurun.Error, gpurun.set, "k", b"1", text="cannot connect to agent")

    def test_hello_refused(self):
        a = self.start_agent()
        os.environ["GPURUN_TOKEN"] = "cd" * 16
        e = self.expect_raises(gpurun.Error, gpurun.set, "k", b"1")
        self.assertIn("hello", str(e))
        self.assertIn("wrong rank or token", str(e))
        self.assertEqual(a.store, {})

    def test_bad_environment(self):
        a = self.start_agent()
        for name, value, text in [("RANK", "x1", "'RANK' is 'x1': expected a decimal number"),
                                  ("RANK", "8", "'RANK' is 8: not below 'WORLD_SIZE' 8"),
                                  ("GPURUN_TOKEN", "xyz1", "not hex"),
                                  ("LOCAL_RANK", "", "'LOCAL_RANK' is empty")]:
            reset_module()
            os.environ.update(rank_env(a, **{name: value}))
            self.expect_raises(gpurun.Error, gpurun.set, "k", b"1", text=text)
        self.assertEqual(a.conns, [], "a bad environment must not reach the agent")


def c_progress_fields():
    """lib/proto.h's PROGRESS_FIELDS, the list the C side is made from, as report()'s copy
    spells it: (key, "I" or "F", required, "any", "nonneg" or "pos") per field."""
    with open(os.path.join(HERE, "..", "..", "lib", "proto.h")) as f:
        text = f.read()
    start = text.index("#define PROGRESS_FIELDS(X)")
    block = []
    for line in text[start:].splitlines()[1:]:
        block.append(line)
        if not line.rstrip().endswith("\\"):
            break
    fields = []
    for line in block:
        m = re.fullmatch(r"\s*X\(\"(\w+)\", '([IF])', (true|false), (\w+), PROGRESS_(\w+)\)\s*\\?",
                         line)
        if not m:
            raise AssertionError("lib/proto.h: a line of PROGRESS_FIELDS not understood: %r"
                                 % line)
        key, kind, required, member, rng = m.groups()
        if member != key:
            raise AssertionError("lib/proto.h: key %r is member %r" % (key, member))
        fields.append((key, kind, required == "true", rng.lower()))
    return tuple(fields)


class ProgressFields(unittest.TestCase):
    """report() spells the progress fields as the C side does: lib/proto.h's list, which
    lib/proto.c and lib/rank/gr.c are made from."""

    def test_the_copy_is_the_c_list(self):
        c = c_progress_fields()
        self.assertGreaterEqual(len(c), 7)
        self.assertEqual(gpurun._PROGRESS_FIELDS, c,
                         "gpurun._PROGRESS_FIELDS differs from lib/proto.h's PROGRESS_FIELDS")

    def test_report_takes_each_field(self):
        params = inspect.signature(gpurun.report).parameters
        self.assertEqual(list(params), [f[0] for f in gpurun._PROGRESS_FIELDS
                                        if f[2]] + [f[0] for f in gpurun._PROGRESS_FIELDS
                                                    if not f[2]])
        for key, _, required, _ in gpurun._PROGRESS_FIELDS:
            kind = params[key].kind
            if required:
                self.assertEqual(kind, inspect.Parameter.POSITIONAL_OR_KEYWORD, key)
            else:
                self.assertEqual(kind, inspect.Parameter.KEYWORD_ONLY, key)
                self.assertIsNone(params[key].default, key)


class Report(Base):
    def last_report(self):
        self.agent.wait_for(lambda: self.agent.msgs("report"), what="report")
        return self.agent.msgs("report")[-1]

    def test_fields(self):
        a = self.start_agent()
        gpurun.report(7, loss=2.5, lr=3e-4, tokens_per_s=1000, grad_norm=1.25, total_steps=100,
                      step_time=0.5)
        got = self.last_report()
        self.assertEqual(got, {"type": "report", "step": 7, "loss": 2.5, "lr": 3e-4,
                               "tokens_per_s": 1000.0, "grad_norm": 1.25, "total_steps": 100,
                               "step_time": 0.5})
        # Every field given: every key of lib/proto.h's list (ProgressFields below).
        self.assertEqual(set(got) - {"type"}, {f[0] for f in c_progress_fields()})
        self.assertNotIn("id", got)
        gpurun.report(8)
        a.wait_for(lambda: len(a.msgs("report")) == 2, what="second report")
        # Numbers not given are left out: unknown, not 0.
        self.assertEqual(a.msgs("report")[-1], {"type": "report", "step": 8})

    def test_step_types(self):
        a = self.start_agent()
        for bad in (True, False, "3", None, 1.5, float("nan"), [1]):
            self.expect_raises(TypeError, gpurun.report, bad, text="step must be an integer")
        self.expect_raises(TypeError, gpurun.report, 1, total_steps=2.5, text="total_steps")
        self.expect_raises(ValueError, gpurun.report, 1, total_steps=-1, text="negative")
        self.expect_raises(ValueError, gpurun.report, -1, text="step -1 is negative")
        self.expect_raises(ValueError, gpurun.report, 2**63, text="64-bit range")
        self.expect_raises(TypeError, gpurun.report, 1, loss="0.5", text="loss must be a number")
        self.expect_raises(TypeError, gpurun.report, 1, lr=True, text="lr must be a number")
        self.expect_raises(TypeError, gpurun.report, 1, loss=object(), text="loss")
        gpurun.report(3.0)

        class Index:
            def __index__(self):
                return 4
        gpurun.report(Index())
        a.wait_for(lambda: len(a.msgs("report")) == 2, what="two reports")
        self.assertEqual([m["step"] for m in a.msgs("report")], [3, 4])

    def test_numbers_with_float(self):
        a = self.start_agent()

        class Tensorish:  # a torch scalar tensor: float() gives its value
            def __float__(self):
                return 0.75
        gpurun.report(1, loss=Tensorish())
        self.assertEqual(self.last_report()["loss"], 0.75)
        self.assertEqual(len(a.msgs("report")), 1)

    def test_nan_and_inf_are_left_out_and_each_warned_once(self):
        a = self.start_agent()
        err = io.StringIO()
        with redirect_stderr(err):
            gpurun.report(1, loss=float("nan"), lr=0.1)
            line = sys._getframe().f_lineno - 1
            gpurun.report(2, loss=float("inf"), grad_norm=float("-inf"))
            # The same kinds again: no more lines (a diverged run reports them every step).
            gpurun.report(3, loss=float("nan"))
            gpurun.report(4, loss=float("inf"), grad_norm=float("-inf"))
        a.wait_for(lambda: len(a.msgs("report")) == 4, what="four reports")
        r1, r2, r3, r4 = a.msgs("report")
        self.assertEqual(r1, {"type": "report", "step": 1, "lr": 0.1})
        self.assertEqual(r2, {"type": "report", "step": 2})
        self.assertEqual(r4, {"type": "report", "step": 4})
        want = ("gpurun.report: test_gpurun.py:%d: loss is nan: not reported\n"
                "gpurun.report: test_gpurun.py:%d: loss is inf: not reported\n"
                "gpurun.report: test_gpurun.py:%d: grad_norm is -inf: not reported\n"
                % (line, line + 2, line + 2))
        self.assertEqual(err.getvalue(), want, "stderr: expected one line per kind")

    def test_negative_rates_are_left_out_and_warned(self):
        a = self.start_agent()
        err = io.StringIO()
        with redirect_stderr(err):
            gpurun.report(1, loss=-0.5, lr=-1e-4, tokens_per_s=-5, grad_norm=1.0)
            line = sys._getframe().f_lineno - 1
            gpurun.report(2, tokens_per_s=-7, grad_norm=-1.0, step_time=-0.25)
            gpurun.report(3, tokens_per_s=0, grad_norm=0, step_time=0.5)
            # A step time of 0 is unknown, as in C: left out without a word.
            gpurun.report(4, step_time=0)
        a.wait_for(lambda: len(a.msgs("report")) == 4, what="four reports")
        r1, r2, r3, r4 = a.msgs("report")
        # A loss (a log-likelihood's) and an lr may be negative: kept.
        self.assertEqual(r1, {"type": "report", "step": 1, "loss": -0.5, "lr": -1e-4,
                              "grad_norm": 1.0})
        self.assertEqual(r2, {"type": "report", "step": 2})
        self.assertEqual(r3, {"type": "report", "step": 3, "tokens_per_s": 0.0,
                              "grad_norm": 0.0, "step_time": 0.5})
        self.assertEqual(r4, {"type": "report", "step": 4})
        want = ("gpurun.report: test_gpurun.py:%d: tokens_per_s is -5 (negative): not reported\n"
                "gpurun.report: test_gpurun.py:%d: grad_norm is -1 (negative): not reported\n"
                "gpurun.report: test_gpurun.py:%d: step_time is -0.25 (negative): not reported\n"
                % (line, line + 2, line + 2))
        self.assertEqual(err.getvalue(), want, "stderr: one line per kind, the first time")

    def test_nan_quiet_outside_a_job(self):
        err = io.StringIO()
        with redirect_stderr(err):
            gpurun.report(1, tokens_per_s=float("inf"))
        self.assertEqual(err.getvalue(), "", "outside a job report() is a quiet no-op")

    def test_never_blocks_on_a_stuck_agent(self):
        a = self.start_agent()
        gpurun.set("k", b"1")
        a.reading.clear()
        t0 = time.monotonic()
        for i in range(20000):
            gpurun.report(i, loss=1.0)
        took = time.monotonic() - t0
        self.assertLess(took, 5.0, "20000 reports to a stuck agent took %.1f s" % took)
        a.reading.set()
        # Once the agent reads again, later reports go through.
        gpurun.set("k2", b"2")
        gpurun.report(99999, loss=2.0)
        a.wait_for(lambda: any(m["step"] == 99999 for m in a.msgs("report")),
                   what="the report after the stall")

    def test_report_while_another_thread_waits(self):
        a = self.start_agent()
        held = []
        a.answer["barrier"] = lambda c, m: held.append((c, m))
        t = threading.Thread(target=gpurun.barrier, args=("wait",))
        t.start()
        a.wait_for(lambda: held, what="barrier")
        t0 = time.monotonic()
        gpurun.report(5, loss=1.0)
        self.assertLess(time.monotonic() - t0, 0.5, "report waited for the barrier")
        a.wait_for(lambda: a.msgs("report"), what="report during a barrier")
        c, m = held[0]
        c.send({"type": "ok", "id": m["id"]})
        t.join(5)
        self.assertFalse(t.is_alive(), "the barrier did not return after its answer")


class Threads(Base):
    def test_concurrent_requests(self):
        a = self.start_agent()
        errors = []
        # One thread blocks on a key that appears only at the end: the others go on.
        blocked = {}

        def waiter():
            try:
                blocked["v"] = gpurun.get("last")
            except Exception as e:
                errors.append(repr(e))

        def worker(n):
            try:
                for i in range(40):
                    key = "t%d/%d" % (n, i)
                    value = os.urandom(n * 7 + i)
                    gpurun.set(key, value)
                    got = gpurun.get(key, timeout=0)
                    if got != value:
                        errors.append("%s: got %r, expected %r" % (key, got, value))
                    gpurun.report(i)
            except Exception as e:
                errors.append(repr(e))
        a.answer["kv_get"] = self.slow_last(a)
        w = threading.Thread(target=waiter)
        w.start()
        ts = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(30)
        self.assertEqual(errors, [])
        self.assertTrue(w.is_alive(), "the waiter should still wait for 'last'")
        gpurun.set("last", b"done")
        self.release_last()
        w.join(10)
        self.assertEqual(blocked.get("v"), b"done")
        self.assertEqual(len(a.conns), 1)

    def slow_last(self, agent):
        """kv_get answers at once, but 'last' only once release_last() is called."""
        self.pending = []

        def answer(c, m):
            if m["key"] == "last":
                self.pending.append((c, m))
                return None
            if m["key"] in agent.store:
                return [{"type": "kv_val", "id": m["id"], "value": agent.store[m["key"]]}]
            return [{"type": "error", "id": m["id"], "code": "not_found", "msg": "no such key"}]
        return answer

    def release_last(self):
        self.agent.wait_for(lambda: self.pending, what="the waiter's kv_get")
        c, m = self.pending[0]
        c.send({"type": "kv_val", "id": m["id"], "value": self.agent.store["last"]})


class Fork(Base):
    def test_child_opens_its_own_connection(self):
        a = self.start_agent()
        gpurun.set("parent", b"1")
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                gpurun.set("child", b"2")
                code = 0 if gpurun.get("parent", timeout=0) == b"1" else 3
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        self.assertTrue(os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0,
                        "the child failed: wait status %#x" % status)
        self.assertEqual(len(a.conns), 2, "expected the child's own connection")
        self.assertEqual(a.conns[1].msgs[0]["type"], "hello")
        # The parent's connection is as it was.
        gpurun.set("parent2", b"3")
        self.assertEqual(gpurun.get("child", timeout=0), b"2")
        self.assertEqual(a.conns[0].msgs[-2]["key"], "parent2")


class Preempt(Base):
    def setUp(self):
        super().setUp()
        self.old = {s: signal.getsignal(s) for s in (signal.SIGUSR1, signal.SIGUSR2)}

    def tearDown(self):
        for s, h in self.old.items():
            signal.signal(s, h)
        super().tearDown()

    def test_handler_and_request(self):
        a = self.start_agent()
        got = []
        self.assertFalse(gpurun.preempt_requested())
        sig = gpurun.on_preempt(got.append)
        self.assertEqual(sig, signal.SIGUSR1)
        self.assertEqual([m["type"] for m in a.msgs()], ["hello", "preempt"])
        os.kill(os.getpid(), signal.SIGUSR1)
        time.sleep(0.01)
        self.assertEqual(got, [signal.SIGUSR1], "callback: got %r" % got)
        self.assertTrue(gpurun.preempt_requested())

    def test_forked_child_ignores_it(self):
        self.start_agent()
        got = []
        gpurun.on_preempt(got.append)
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.close(r)
                os.write(w, b"x")
                time.sleep(1)  # the signal comes meanwhile
                code = 0 if not got and not gpurun.preempt_requested() else 2
            finally:
                os._exit(code)
        os.close(w)
        os.read(r, 1)
        os.close(r)
        os.kill(pid, signal.SIGUSR1)
        _, status = os.waitpid(pid, 0)
        self.assertTrue(os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0,
                        "the child: wait status %#x (killed, or its callback ran)" % status)
        self.assertEqual(got, [])

    def test_signal_from_the_environment(self):
        self.start_agent(GPURUN_PREEMPT_SIGNAL=str(int(signal.SIGUSR2)))
        self.assertEqual(gpurun.on_preempt(), signal.SIGUSR2)
        os.kill(os.getpid(), signal.SIGUSR2)
        time.sleep(0.01)
        self.assertTrue(gpurun.preempt_requested())
        reset_module()
        os.environ["GPURUN_PREEMPT_SIGNAL"] = "USR1"
        self.expect_raises(gpurun.Error, gpurun.on_preempt, text="not a signal number")

    def test_main_thread_only(self):
        self.start_agent()
        out = []
        t = threading.Thread(target=lambda: out.append(
            self.expect_raises(ValueError, gpurun.on_preempt, text="main thread")))
        t.start()
        t.join()
        self.assertEqual(len(out), 1)
        self.expect_raises(TypeError, gpurun.on_preempt, 5, text="callable")

    def test_callback_calling_in_does_not_deadlock(self):
        a = self.start_agent()
        seen = []

        def cb(sig):
            try:
                gpurun.set("from-handler", b"1")
                seen.append("ok")
            except gpurun.Error as e:
                seen.append(str(e))
        gpurun.on_preempt(cb)
        a.answer["kv_get"] = lambda c, m: (threading.Timer(0.3, c.send, [{
            "type": "kv_val", "id": m["id"], "value": b64(b"v")}]).start(), None)[1]
        threading.Timer(0.1, os.kill, [os.getpid(), signal.SIGUSR1]).start()
        self.assertEqual(gpurun.get("k"), b"v")
        self.assertEqual(len(seen), 1)
        self.assertIn("waits for the agent", seen[0], "the handler's call: got %r" % seen)


class Finalize(Base):
    def test_finalize_then_calls(self):
        a = self.start_agent()
        gpurun.set("k", b"1")
        gpurun.finalize()
        self.assertEqual(a.msgs()[-1]["type"], "finalize")
        self.expect_raises(gpurun.Error, gpurun.get, "k", text="after gpurun.finalize()")
        gpurun.report(1)
        gpurun.finalize()
        self.assertEqual(len(a.msgs("finalize")), 1)
        self.assertEqual(a.msgs("report"), [])

    def test_atexit_finalizes(self):
        a = self.start_agent()
        env = dict(os.environ, PYTHONPATH=PKG)
        p = subprocess.run([sys.executable, "-c", "import gpurun; gpurun.set('k', b'x')"],
                           env=env, capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        a.wait_for(lambda: a.msgs("finalize"), what="finalize at exit")
        self.assertEqual([m["type"] for m in a.msgs()], ["hello", "kv_put", "finalize"])

    def test_no_connection_for_a_silent_process(self):
        a = self.start_agent()
        env = dict(os.environ, PYTHONPATH=PKG)
        p = subprocess.run([sys.executable, "-c", "import gpurun; print(gpurun.rank())"],
                           env=env, capture_output=True, text=True, timeout=60)
        self.assertEqual((p.returncode, p.stdout), (0, "3\n"), p.stderr)
        time.sleep(0.1)
        self.assertEqual(a.conns, [], "a process that made no request must not connect")


class Regroup(Base):
    def regroup_agent(self, answers):
        """An agent that says ok to regroup_ok and answers each regroup with the next of
        answers: a generation (int) or an error code (str)."""
        a = self.start_agent()
        left = list(answers)

        def answer(c, m):
            x = left.pop(0)
            if isinstance(x, int):
                return [{"type": "regroup", "id": m["id"], "generation": x}]
            return [{"type": "error", "id": m["id"], "code": x, "msg": "the node's ranks are "
                     "being torn down"}]
        a.answer["regroup"] = answer
        a.answer["regroup_ok"] = lambda c, m: [{"type": "ok", "id": m["id"]}]
        return a

    def test_generations_and_barrier_names(self):
        a = self.regroup_agent([3, "aborted", 3])
        self.assertEqual(gpurun.generation(), 2)  # GPURUN_RESTART_COUNT
        gpurun.regroup_enable()
        gpurun.barrier()
        gpurun.barrier()
        self.assertEqual(gpurun.regroup(timeout=5), 3)
        self.assertEqual(gpurun.generation(), 3)
        self.assertEqual(gpurun.restart_count(), 2)
        gpurun.barrier()
        self.assertEqual([(m["type"], m.get("name"), m.get("generation")) for m in a.msgs()[1:]],
                         [("regroup_ok", None, None), ("barrier", "#0", None),
                          ("barrier", "#1", None), ("regroup", None, 2),
                          ("barrier", "#0", None)])
        e = self.expect_raises(gpurun.Aborted, gpurun.regroup, text="torn down")
        self.assertIsInstance(e, gpurun.Error)
        self.assertEqual(a.msgs("regroup")[-1]["generation"], 3)
        self.assertEqual(gpurun.generation(), 3)
        # An agent that names a generation that is not later breaks the link.
        self.expect_raises(gpurun.Error, gpurun.regroup, text="not one after 3")
        self.expect_raises(gpurun.Error, gpurun.set, "k", b"v", text="not one after 3")

    def test_timeout(self):
        a = self.start_agent()
        a.answer["regroup"] = lambda c, m: None
        t0 = time.monotonic()
        self.expect_raises(gpurun.TimeoutError, gpurun.regroup, 0.2, text="regroup")
        self.assertLess(time.monotonic() - t0, 5)
        self.expect_raises(ValueError, gpurun.regroup, -1)
        self.expect_raises(TypeError, gpurun.regroup, "5")

    def test_outside_a_job(self):
        self.assertIsNone(gpurun.regroup_enable())
        self.assertEqual(gpurun.generation(), 0)
        self.expect_raises(gpurun.Error, gpurun.regroup, text="not in a gpurun job")


class Place(Base):
    def test_in_a_job(self):
        self.start_agent()
        got = (gpurun.in_job(), gpurun.rank(), gpurun.world_size(), gpurun.local_rank(),
               gpurun.local_world_size(), gpurun.node_rank(), gpurun.restart_count(),
               gpurun.job_id())
        self.assertEqual(got, (True, 3, 8, 1, 2, 1, 2, "local-test"))


class Outside(Base):
    def test_everything_is_a_quiet_no_op(self):
        err = io.StringIO()
        with redirect_stderr(err):
            got = (gpurun.in_job(), gpurun.rank(), gpurun.world_size(), gpurun.local_rank(),
                   gpurun.local_world_size(), gpurun.node_rank(), gpurun.restart_count(),
                   gpurun.job_id(), gpurun.report(1, loss=0.5), gpurun.set("k", b"v"),
                   gpurun.get("k"), gpurun.get("k", timeout=0), gpurun.delete("k"),
                   gpurun.barrier(), gpurun.barrier("x", timeout=1), gpurun.on_preempt(print),
                   gpurun.preempt_requested(), gpurun.finalize())
        self.assertEqual(got, (False, 0, 1, 0, 1, 0, 0, None, None, None, None, None, None,
                               None, None, None, False, None))
        self.assertEqual(err.getvalue(), "")
        self.assertEqual(signal.getsignal(signal.SIGUSR1), signal.SIG_DFL,
                         "on_preempt outside a job must install nothing")

    def test_torchrun_place(self):
        os.environ.update({"RANK": "5", "WORLD_SIZE": "6", "LOCAL_RANK": "1",
                           "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "2",
                           "TORCHELASTIC_RESTART_COUNT": "1"})
        got = (gpurun.rank(), gpurun.world_size(), gpurun.local_rank(),
               gpurun.local_world_size(), gpurun.node_rank(), gpurun.restart_count())
        self.assertEqual(got, (5, 6, 1, 2, 2, 1))

    def test_import_pulls_in_no_framework(self):
        p = subprocess.run([sys.executable, "-c",
                            "import sys, gpurun, gpurun.lightning, gpurun.hf; "
                            "bad = [m for m in ('torch', 'lightning', 'pytorch_lightning', "
                            "'transformers') if m in sys.modules]; print(bad)"],
                           env=dict(os.environ, PYTHONPATH=PKG), capture_output=True,
                           text=True, timeout=60)
        self.assertEqual((p.returncode, p.stdout.strip()), (0, "[]"), p.stderr)

    def test_version(self):
        self.assertRegex(gpurun.__version__, r"^\d+\.\d+\.\d+$")


if __name__ == "__main__":
    unittest.main()
