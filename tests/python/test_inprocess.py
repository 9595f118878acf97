"""Unit tests of gpurun.inprocess that need torch but no job: which errors are a failed
collective (a regroup may follow) and which are the script's own (raised at once); a script
outside a gpurun job runs once, as under torchrun."""
import os
import sys
import unittest

PKG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "lib", "rank",
                   "python")
sys.path.insert(0, PKG)

import torch  # noqa: E402

from gpurun import inprocess  # noqa: E402


class CollectiveFailure(unittest.TestCase):
    def test_the_backends_words(self):
        for text in ("[./gloo/transport/tcp/pair.cc:589] Read error [127.0.0.1]:57572: "
                     "Connection reset by peer",
                     "[./gloo/transport/tcp/pair.cc:598] Connection closed by peer",
                     "NCCL communicator was aborted on rank 0",
                     "Broken pipe"):
            self.assertTrue(inprocess.collective_failure(RuntimeError(text)), text)

    def test_the_scripts_own_errors(self):
        for err in (RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"),
                    RuntimeError("mat1 and mat2 shapes cannot be multiplied (4x3 and 5x6)"),
                    ValueError("nccl"), KeyError("gloo")):
            self.assertFalse(inprocess.collective_failure(err), repr(err))
        oom = getattr(torch.cuda, "OutOfMemoryError", None)
        if oom is not None:
            self.assertFalse(inprocess.collective_failure(oom("NCCL out of memory")))


class Outside(unittest.TestCase):
    def test_runs_once_with_generation_0(self):
        saved = {k: os.environ.get(k) for k in ("GPURUN_SOCK", "MASTER_ADDR", "MASTER_PORT",
                                                "RANK", "WORLD_SIZE")}
        try:
            os.environ.pop("GPURUN_SOCK", None)
            os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "0", "RANK": "0",
                               "WORLD_SIZE": "1"})
            calls = []
            self.assertEqual(inprocess.run(lambda g: calls.append(g) or "done"), "done")
            self.assertEqual(calls, [0])
            inprocess.destroy()
            # Outside a job a failed collective is raised as it is: there is nothing to regroup.
            with self.assertRaisesRegex(RuntimeError, "^Connection reset by peer$"):
                inprocess.run(lambda g: (_ for _ in ()).throw(
                    RuntimeError("Connection reset by peer")))
        finally:
            inprocess.destroy()
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


if __name__ == "__main__":
    unittest.main()
