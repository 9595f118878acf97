#!/usr/bin/env bash
# The frameworks lane (fw_common.sh): DeepSpeed 0.14.5 from PyPI, ZeRO stage 2 through the
# Hugging Face Trainer (transformers 4.29.2) on CPUs (DS_ACCELERATOR=cpu, gloo), a tiny GPT-2,
# in a script written for `mpirun python3 ds_gpt2.py` (tests/python/lane.py deepspeed: its
# place from OMPI_COMM_WORLD_*), run under gpurun in both layouts of 2 ranks with nothing set
# by hand: the Trainer's rank and world are Open MPI's, the 2 ranks end with the same
# parameters in either layout, each with its share of the CPU threads.
#
# DeepSpeed 0.14.1 is the first whose CPU accelerator runs without Intel's oneCCL bindings
# (falling back to gloo); 0.14.x still takes pydantic 1 (2 would shadow Debian's
# typing-extensions); from 0.16.5 on it needs torch 2. Its source release installs without
# compiled ops (DS_BUILD_OPS=0), and two lines of its installed copy are changed, see below.
# timeout: 600
set -euo pipefail
# shellcheck source=fw_common.sh
. "$(dirname "$0")/fw_common.sh"

fw_need_python
fw_install hf "${FW_HF[@]}" || skip "$fw_why"
export DS_BUILD_OPS=0 DS_ACCELERATOR=cpu
fw_install deepspeed deepspeed==0.14.5 hjson==3.1.0 py-cpuinfo==9.0.0 pydantic==1.10.21 \
    ninja==1.11.1.1 || skip "$fw_why"

# The two changes, to deepspeed/comm/torch.py, made once (each sed matches only the line as
# released):
#   - its CPU path gathers ZeRO's partitions with all_gather_into_tensor where torch has the
#     function, but torch 1.13's gloo does not implement it ("no support for _allgather_base
#     in Gloo process group"): DeepSpeed's own fallback, all_gather of the shards, is taken on
#     gloo;
#   - its CPU backend compiles a C++ op at start-up (ninja, about 36 s a rank) for
#     inference_all_reduce alone, which falls back to torch's all_reduce without it: not built.
comm=$deps/deepspeed/deepspeed/comm/torch.py
sed -i -e 's/^        return self.all_gather_function is not None$/        return self.all_gather_function is not None and not (torch.distributed.is_initialized() and torch.distributed.get_backend() == "gloo")  # torch 1.13: gloo has no _allgather_base/' \
    -e 's/^def build_shm_op():$/def build_shm_op():  # the lane: never built (inference_all_reduce only)\n    return None/' \
    "$comm"
for made in 'torch 1.13: gloo has no _allgather_base' 'the lane: never built'; do
    grep -q "$made" "$comm" || fail "deepspeed: $comm has not the line the change '$made' is for"
done
export PYTHONPATH=$deps/deepspeed:$deps/hf
fw_both deepspeed -- "$python" "$root/tests/python/lane.py" deepspeed "$work/deepspeed"
