"""Rank programs of tests/integ/python_module.sh: Python ranks that use the gpurun module in a
real `gpurun --local` job. Each prints one line saying what worked, or exits 1 with one line
saying what did not.

usage: ranks.py store | gr_example | status | preempt | garbage"""

import json
import os
import socket
import struct
import sys
import time

import gpurun

WAIT = 60.0  # seconds a rank waits for the others: they start within a second or two


def die(what):
    print("rank %d: %s" % (gpurun.rank(), what), flush=True)
    sys.exit(1)


def expect(got, want, what):
    if got != want:
        die("%s: got %r, expected %r" % (what, got, want))


def store():
    """The store and barriers across every rank: binary values, implicit and named barriers,
    a missing key without wait and with a timeout, delete, a barrier timeout's error."""
    r, w = gpurun.rank(), gpurun.world_size()
    gpurun.set("py/%d" % r, bytes([r, 0, 255]) + ("r\u00e9%d" % r).encode())
    gpurun.set("str/%d" % r, "text %d" % r)
    gpurun.barrier()
    for i in range(w):
        expect(gpurun.get("py/%d" % i, timeout=0), bytes([i, 0, 255]) + ("r\u00e9%d" % i).encode(),
               "py/%d" % i)
        expect(gpurun.get("str/%d" % i, timeout=0), b"text %d" % i, "str/%d" % i)
    try:
        gpurun.get("missing", timeout=0)
        die("get of a missing key returned")
    except KeyError:
        pass
    t0 = time.monotonic()
    try:
        gpurun.get("missing", timeout=0.3)
        die("get with a timeout returned")
    except gpurun.TimeoutError as e:
        waited = time.monotonic() - t0
        if not 0.25 <= waited < 5:
            die("get timeout 0.3 s returned after %.2f s: %s" % (waited, e))
    # A key another rank puts later: a get without limit waits for it.
    if r == w - 1:
        time.sleep(0.3)
        gpurun.set("late", b"L")
    expect(gpurun.get("late", timeout=WAIT), b"L", "late")
    gpurun.barrier("deleted", timeout=WAIT)
    if r == 0:
        gpurun.delete("late")
    gpurun.barrier(timeout=WAIT)
    try:
        gpurun.get("late", timeout=0)
        die("'late' is still there after delete")
    except KeyError:
        pass
    # A barrier only rank 0 calls: it times out there, with the agent's word for it.
    if r == 0:
        try:
            gpurun.barrier("alone", timeout=0.3)
            die("a barrier no other rank called returned")
        except gpurun.TimeoutError as e:
            expect(str(e), "barrier 'alone': not every rank arrived within 300 ms", "timeout text")
    gpurun.barrier("done", timeout=WAIT)
    print("rank %d/%d local %d/%d node %d: python store ok, barrier ok"
          % (r, w, gpurun.local_rank(), gpurun.local_world_size(), gpurun.node_rank()),
          flush=True)


def gr_example():
    """tests/helpers/gr_example.c in Python, key for key and barrier for barrier, so that C and
    Python ranks run in one job: rank 0's 128-byte binary id read by every rank, an address
    per rank read by all after the implicit barrier "#0", reports, the barrier "done"."""
    r, w, lw = gpurun.rank(), gpurun.world_size(), gpurun.local_world_size()
    uid = bytearray((i * 151 + 7) & 0xFF for i in range(128))
    uid[5], uid[6] = 0x00, 0xFF
    if r == 0:
        gpurun.set("uid", bytes(uid))
    expect(gpurun.get("uid", timeout=WAIT), bytes(uid), "uid")
    gpurun.set("addr/%d" % r, "node%d:%d" % (gpurun.node_rank(), 29500 + r))
    gpurun.barrier(timeout=WAIT)
    for i in range(w):
        expect(gpurun.get("addr/%d" % i, timeout=0), b"node%d:%d" % (i // lw, 29500 + i),
               "addr/%d" % i)
    for s in range(3):
        gpurun.report(s, loss=10.0 / (s + 1), lr=3e-4, tokens_per_s=1000.0 * (r + 1),
                      grad_norm=1.0)
    gpurun.barrier("done", timeout=WAIT)
    print("rank %d/%d local %d node %d: python, store ok, barrier ok"
          % (r, w, gpurun.local_rank(), gpurun.node_rank()), flush=True)


def status():
    """Reports a step, a loss and the total steps, then waits for the file 'go' in the job
    dir. Rank 1's loss is NaN (left out of the report, one warning line)."""
    r = gpurun.rank()
    loss = float("nan") if r == 1 else 2.0 + r / 4
    gpurun.report(10 + r, loss=loss, lr=0.001, tokens_per_s=100.0 * (r + 1), total_steps=500)
    print("reported", flush=True)
    go = os.path.join(os.environ["GPURUN_JOB_DIR"], "go")
    end = time.monotonic() + WAIT
    while not os.path.exists(go):
        if time.monotonic() > end:
            die("no 'go' within %d s" % WAIT)
        time.sleep(0.05)


def preempt():
    """Rank 0 asks for the pre-timeout signal; its callback records it and the rank exits 0.
    The other ranks do not ask: a SIGUSR1 handler of their own would say so if the signal
    reached them. They end when rank 0 has written 'preempted' in the job dir."""
    r = gpurun.rank()
    jobdir = os.environ["GPURUN_JOB_DIR"]
    got = []
    if r == 0:
        sig = gpurun.on_preempt(got.append)
        print("asked for signal %d" % sig, flush=True)
    else:
        import signal
        signal.signal(signal.SIGUSR1, lambda s, f: print("got signal %d without asking" % s,
                                                         flush=True))
        print("did not ask", flush=True)
    end = time.monotonic() + WAIT
    while time.monotonic() < end:
        if r == 0 and gpurun.preempt_requested():
            print("callback got signal %s; preempt_requested() is True" % got, flush=True)
            with open(os.path.join(jobdir, "preempted"), "w") as f:
                f.write("0\n")
            return
        if r != 0 and os.path.exists(os.path.join(jobdir, "preempted")):
            time.sleep(0.3)  # a signal on its way would land by now
            print("rank %d ends" % r, flush=True)
            return
        time.sleep(0.02)
    die("no end within %d s" % WAIT)


def garbage():
    """The last rank opens the agent's socket itself, says hello with its token, then sends a
    frame that is not JSON, and prints the error frame it gets back; then every rank (that one
    too, through the module's own connection) uses the store as usual."""
    r, w = gpurun.rank(), gpurun.world_size()
    if r == w - 1:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(10)
        s.connect(os.environ["GPURUN_SOCK"])

        def send(body):
            s.sendall(struct.pack(">I", len(body)) + body)

        def recv():
            buf = b""
            while len(buf) < 4 or len(buf) < 4 + struct.unpack(">I", buf[:4])[0]:
                chunk = s.recv(4096)
                if not chunk:
                    die("the agent closed the connection")
                buf += chunk
            return json.loads(buf[4:4 + struct.unpack(">I", buf[:4])[0]])
        send(json.dumps({"type": "hello", "rank": r,
                         "token": os.environ["GPURUN_TOKEN"]}).encode())
        expect(recv(), {"type": "ok", "id": 0}, "hello's answer")
        send(b"\x01garbage, not JSON")
        err = recv()
        print("garbage answered: %s %s" % (err.get("type"), err.get("code")), flush=True)
        s.close()
        # Garbage as the first frame: an error, then the agent hangs up (no hello, no rank).
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(10)
        s.connect(os.environ["GPURUN_SOCK"])
        send(b"\x02not a hello")
        err = recv()
        closed = s.recv(1) == b""
        print("garbage before hello: %s %s, %s" % (err.get("type"), err.get("code"),
                                                    "closed" if closed else "left open"),
              flush=True)
        s.close()
    gpurun.set("g/%d" % r, b"%d" % r)
    gpurun.barrier(timeout=WAIT)
    for i in range(w):
        expect(gpurun.get("g/%d" % i, timeout=0), b"%d" % i, "g/%d" % i)
    print("rank %d: store ok after the garbage" % r, flush=True)


MODES = {"store": store, "gr_example": gr_example, "status": status, "preempt": preempt,
         "garbage": garbage}

if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in MODES:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        sys.exit(2)
    MODES[sys.argv[1]]()
