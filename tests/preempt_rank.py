"""A rank for the pre-timeout tests. "prepared": asks for the pre-timeout signal with
gpurun.on_preempt, and when it comes writes a checkpoint file into the job dir and exits 0.
"unprepared": sleeps, as a script that knows nothing of gpurun does."""
import os
import sys
import time

import gpurun


def main():
    mode = sys.argv[1]
    rank = gpurun.rank()
    if mode == "prepared":
        gpurun.on_preempt(lambda sig: print(f"rank {rank}: pre-timeout signal {sig}", flush=True))
    print(f"rank {rank} {mode} up", flush=True)
    for step in range(1, 100000):
        gpurun.report(step)
        if mode == "prepared" and gpurun.preempt_requested():
            path = os.path.join(os.environ["GPURUN_JOB_DIR"], f"ckpt-{rank}")
            with open(path, "w") as f:
                f.write(f"step {step}\n")
            print(f"rank {rank}: checkpoint at step {step}, exiting", flush=True)
            return 0
        time.sleep(0.2)
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
