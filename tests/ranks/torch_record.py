"""A torch rank whose main is wrapped in torch's @record: rank 1 raises, and the exception
torch writes to TORCHELASTIC_ERROR_FILE must reach gpurun's first-failure report. Every rank
also prints the torchrun variables it was given, for the test to check."""
import os
import sys

from torch.distributed.elastic.multiprocessing.errors import record

NAMES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
         "GROUP_WORLD_SIZE", "ROLE_NAME", "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR",
         "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
         "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE",
         "TORCH_NCCL_ASYNC_ERROR_HANDLING", "PYTHONUNBUFFERED", "PYTHONFAULTHANDLER",
         "OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES")


def check_input(rank):
    if rank == 1:
        raise ValueError(f"bad batch on rank {rank}")


@record
def main():
    rank = int(os.environ["RANK"])
    print("env " + " ".join(f"{n}={os.environ.get(n, '<unset>')}" for n in NAMES))
    err = os.environ.get("TORCHELASTIC_ERROR_FILE", "")
    print(f"error file {os.path.basename(err)}")
    check_input(rank)
    return 0


if __name__ == "__main__":
    sys.exit(main())
