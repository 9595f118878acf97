"""A rank of tests/integ/local_memckpt.sh: memory checkpoints across a restart.

usage: memckpt_job.py MODE
  restart  generation 0 saves bytes (step 5) and a torch state dict (step 7), then starts a
           third save it never finishes (a temp file cut short) and rank 1 fails; generation 1
           loads both and prints what it got.
  spare    2 nodes of 1 rank and a spare: generation 0 saves (step 11), rank 1 waits until
           its copy is on node 0 too, then kills its own node's daemon; generation 1, rank 1 on
           the spare, loads and prints what it got.
  cap      saves 2 MiB under --mem-ckpt-max 1 and prints the refusal; the 100-byte copy saved
           before stays.
  both     3 nodes of 1 rank and 2 spares: generation 0 saves (step 13); once rank 1's copy is
           on node 2 (its holder) and rank 2's on node 0, rank 1 kills node 2's daemon and
           then its own, so that both of rank 1's copies are gone; generation 1 loads what is
           left: ranks 0 and 2 their copies, rank 1 none (a trainer's disk then serves).
  cut      2 nodes of 1 rank and a spare: generation 0 saves (step 1); once rank 1's copy is
           on node 0, rank 1 saves 256 MiB (step 2) and kills its own node's daemon while that
           copy crosses to node 0; generation 1, rank 1 on the spare, loads what node 0 kept:
           the older copy whole, or the newer whole, never a part.
  flood    2 nodes of 1 rank: rank 1 saves 300 copies of 1 MiB as fast as it can while rank 0
           times round trips of the job's store (agent, leader, agent); then node 0 must hold
           rank 1's newest copy, byte for byte."""
import hashlib
import os
import signal
import sys
import time

import gpurun
from gpurun import memckpt


def restart():
    r = gpurun.rank()
    got = memckpt.load()
    if got is None:
        assert gpurun.restart_count() == 0, "generation %d found no copy" % gpurun.restart_count()
        assert memckpt.save(b"hello from rank %d" % r, step=5)
        import torch
        assert memckpt.save({"w": torch.arange(6, dtype=torch.float32) * (r + 1)}, name="sd",
                            step=7)
        # A save cut short: the temp file of "state" half written, never kept.
        with open(os.path.join(os.environ["GPURUN_MEM_DIR"], "r%d.state.tmp" % r), "wb") as f:
            f.write(b"GRMEM1b torn")
        gpurun.barrier("saved")
        print("generation 0 saved", flush=True)
        if r == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        return
    step, data = got
    sd_step, sd = memckpt.load("sd")
    print("rank %d generation %d: state step %d %r; sd step %d w %s"
          % (r, gpurun.restart_count(), step, data, sd_step, sd["w"].tolist()), flush=True)


def spare():
    r = gpurun.rank()
    got = memckpt.load()
    if got is None:
        assert gpurun.restart_count() == 0, "generation %d found no copy" % gpurun.restart_count()
        assert memckpt.save(b"state of rank %d" % r, step=11)
        gpurun.barrier("saved")
        if r == 1:
            # Node 0 holds node 1's copies (the next node's slot holds each node's):
            # gpurun --local's directories differ by their "-nN" only.
            held = os.environ["GPURUN_MEM_DIR"][:-1] + "0/r1.state"
            for _ in range(1000):
                if os.path.exists(held):
                    break
                time.sleep(0.01)
            assert os.path.exists(held), "no replica at %s" % held
            shim = os.getppid()
            with open("/proc/%d/stat" % shim) as f:
                daemon = int(f.read().rsplit(")", 1)[1].split()[1])
            print("killing node 1's daemon", flush=True)
            os.kill(daemon, signal.SIGKILL)
        time.sleep(60)
        return
    step, data = got
    print("rank %d generation %d node_rank %s: state step %d %r"
          % (r, gpurun.restart_count(), os.environ["NODE_RANK"], step, data), flush=True)


def cap():
    assert memckpt.save(b"x" * 100, name="small", step=1)
    try:
        memckpt.save(b"y" * (2 << 20), name="small", step=2)
        print("saved 2 MiB: not refused", flush=True)
    except gpurun.Error as e:
        print("refused: %s" % e, flush=True)
    step, data = memckpt.load("small")
    print("kept step %d, %d bytes" % (step, len(data)), flush=True)


def own_daemon():
    """This rank's node's rendezvousd: the parent of the rank's shim."""
    with open("/proc/%d/stat" % os.getppid()) as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def wait_for(path):
    for _ in range(1000):
        if os.path.exists(path):
            return
        time.sleep(0.01)
    raise AssertionError("no replica at %s" % path)


def both():
    r = gpurun.rank()
    got = memckpt.load()
    if gpurun.restart_count() == 0:
        assert got is None, "generation 0 found a copy"
        assert memckpt.save(b"state of rank %d" % r, step=13)
        # Each node's daemon, for rank 1 (the nodes are processes of one machine).
        gpurun.set("daemon/%d" % r, b"%d" % own_daemon())
        gpurun.barrier("saved")
        if r == 1:
            # The nodes' directories differ by their "-nN" only.
            base = os.environ["GPURUN_MEM_DIR"][:-1]
            wait_for(base + "2/r1.state")
            wait_for(base + "0/r2.state")
            victim = int(gpurun.get("daemon/2"))
            own = own_daemon()
            print("killing the daemons of nodes 2 and 1", flush=True)
            # Both stopped first: the leader's abort after node 2's loss must not reach node
            # 1's daemon, which would end this rank before it ends its daemon.
            os.kill(own, signal.SIGSTOP)
            os.kill(victim, signal.SIGSTOP)
            os.kill(victim, signal.SIGKILL)
            os.kill(own, signal.SIGKILL)
        time.sleep(60)
        return
    if got is None:
        print("rank %d generation %d: no copy, from disk" % (r, gpurun.restart_count()),
              flush=True)
    else:
        print("rank %d generation %d: state step %d %r" % (r, gpurun.restart_count(), got[0],
                                                           got[1]), flush=True)


def cut():
    r = gpurun.rank()
    got = memckpt.load()
    if gpurun.restart_count() == 0:
        assert got is None, "generation 0 found a copy"
        assert memckpt.save(b"first state of rank %d" % r, step=1)
        gpurun.barrier("saved")
        if r == 1:
            base = os.environ["GPURUN_MEM_DIR"][:-1]
            wait_for(base + "0/r1.state")
            assert memckpt.save(bytes(range(256)) * (1 << 20), step=2)
            # The 256 MiB copy on its way into node 0's store: cut it.
            wait_for(base + "0/r1.state.in")
            print("killing node 1's daemon during the transfer", flush=True)
            os.kill(own_daemon(), signal.SIGKILL)
        time.sleep(60)
        return
    step, data = got
    print("rank %d generation %d: state step %d, %d bytes, sha256 %s"
          % (r, gpurun.restart_count(), step, len(data), hashlib.sha256(data).hexdigest()[:16]),
          flush=True)


def flood():
    r = gpurun.rank()
    n = 300
    if r == 1:
        t0 = time.monotonic()
        for i in range(1, n + 1):
            memckpt.save(bytes([i % 256]) * (1 << 20), step=i)
        print("saved %d copies of 1 MiB in %.0f ms" % (n, 1e3 * (time.monotonic() - t0)),
              flush=True)
        gpurun.set("flood/done", b"1")
        base = os.environ["GPURUN_MEM_DIR"][:-1]
        with open(base + "1/r1.state", "rb") as f:
            mine = f.read()
        t0 = time.monotonic()
        while time.monotonic() - t0 < 30:
            try:
                with open(base + "0/r1.state", "rb") as f:
                    if f.read() == mine:
                        break
            except OSError:
                pass
            time.sleep(0.01)
        else:
            raise AssertionError("node 0 never held rank 1's newest copy")
        print("node 0 holds rank 1's newest copy (step %d) %.0f ms after the last save"
              % (n, 1e3 * (time.monotonic() - t0)), flush=True)
    else:
        worst, trips = 0.0, 0
        while True:
            t0 = time.monotonic()
            gpurun.set("flood/ping", b"%d" % trips)
            done = None
            if trips % 10 == 0:
                try:
                    done = gpurun.get("flood/done", timeout=0)
                except KeyError:
                    pass
            assert gpurun.get("flood/ping") == b"%d" % trips
            worst = max(worst, time.monotonic() - t0)
            trips += 1
            if done is not None:
                break
        print("store round trips during the flood: %d, the slowest %.0f ms"
              % (trips, 1e3 * worst), flush=True)
    gpurun.barrier("end")


if __name__ == "__main__":
    {"restart": restart, "spare": spare, "cap": cap, "both": both, "cut": cut,
     "flood": flood}[sys.argv[1]]()
