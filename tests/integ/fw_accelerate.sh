#!/usr/bin/env bash
# The frameworks lane (fw_common.sh): Hugging Face accelerate 0.20.3 from PyPI, an
# `Accelerator(cpu=True)` training loop as its guides write it (prepare, backward, step), under
# gpurun in both layouts of 2 ranks, no `accelerate launch`: accelerate's own state finds the
# world, the rank and the local rank in gpurun's environment, the 2 ranks end with the same
# parameters in either layout, and each got the CPU threads of its share of the machine.
# timeout: 600
set -euo pipefail
# shellcheck source=fw_common.sh
. "$(dirname "$0")/fw_common.sh"

fw_need_python
fw_install hf "${FW_HF[@]}" || skip "$fw_why"
export PYTHONPATH=$deps/hf
fw_both accelerate -- "$python" "$root/tests/python/lane.py" accelerate "$work/accelerate"
