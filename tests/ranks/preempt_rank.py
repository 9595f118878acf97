"""A rank for the pre-timeout tests. "prepared": asks for the pre-timeout signal with
gpurun.on_preempt, and when it comes writes a checkpoint file into the job dir and exits 0.
"unprepared": sleeps, as a script that knows nothing of gpurun does. "prepared-child": as
prepared, with a child process in its process group that has no handler (a `sleep`, as a
DataLoader worker started with spawn would be): the signal must not reach it. "resume
STEPS": as prepared, but it starts after the step its checkpoint holds, if there is one
(a requeued job), and ends with 0 after step STEPS."""
import os
import subprocess
import sys
import time

import gpurun


def main():
    mode = sys.argv[1]
    rank = gpurun.rank()
    child = subprocess.Popen(["sleep", "600"]) if mode == "prepared-child" else None
    prepared = mode.startswith("prepared") or mode == "resume"
    path = os.path.join(os.environ["GPURUN_JOB_DIR"], f"ckpt-{rank}")
    first, last = 1, 100000
    if mode == "resume":
        last = int(sys.argv[2])
        if os.path.exists(path):
            with open(path) as f:
                first = int(f.read().split()[1]) + 1
            print(f"rank {rank} resumed at step {first}", flush=True)
    if prepared:
        gpurun.on_preempt(lambda sig: print(f"rank {rank}: pre-timeout signal {sig}", flush=True))
    print(f"rank {rank} {mode} up", flush=True)
    for step in range(first, last + 1):
        gpurun.report(step)
        if prepared and gpurun.preempt_requested():
            if child is not None:
                time.sleep(0.3)
                state = "alive" if child.poll() is None else f"dead ({child.returncode})"
                print(f"rank {rank}: child {state}", flush=True)
                child.kill()
                child.wait()
            with open(path, "w") as f:
                f.write(f"step {step}\n")
            print(f"rank {rank}: checkpoint at step {step}, exiting", flush=True)
            return 0
        time.sleep(0.2)
    if mode == "resume":
        print(f"rank {rank} done at step {last}", flush=True)
        return 0
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
