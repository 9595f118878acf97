#!/usr/bin/env bash
# The frameworks lane (fw_common.sh): PyTorch Lightning 1.9.5 from PyPI, a guide's multi-node
# Trainer (strategy "ddp", devices and num_nodes as the launcher was told them) on CPUs, under
# gpurun in both layouts of 2 ranks: Lightning's own environment detection finds each rank's
# place, the 2 ranks end with the same parameters in either layout, and each got the CPU
# threads of its share of the machine.
# timeout: 600
set -euo pipefail
# shellcheck source=fw_common.sh
. "$(dirname "$0")/fw_common.sh"

fw_need_python
fw_install lightning "${FW_LIGHTNING[@]}" || skip "$fw_why"
export PYTHONPATH=$deps/lightning
fw_both lightning -- "$python" "$root/tests/python/lane.py" lightning "$work/lightning"
