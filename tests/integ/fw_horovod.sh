#!/usr/bin/env bash
# The frameworks lane (fw_common.sh): horovod 0.28.1 (PyTorch, gloo controller; built as
# horovod_common.sh's hvd_build does), a training loop as horovod's examples write it
# (hvd.DistributedOptimizer, parameters broadcast from rank 0, data sharded by hvd.rank()),
# under gpurun in both layouts of 2 ranks, no horovodrun: horovod finds its place and its
# rendezvous in gpurun's environment, the 2 ranks end with the same parameters in either
# layout, and each got the CPU threads of its share of the machine.
# timeout: 1800
# Its build of horovod, the longest step of make test, is CPU work with no clock to keep: it
# runs beside the Slurm scripts' waits.
# lane: side
set -euo pipefail
# shellcheck source=fw_common.sh
. "$(dirname "$0")/fw_common.sh"
# shellcheck source=horovod_common.sh
. "$(dirname "$0")/horovod_common.sh"

fw_need_python
hvd_build "$python"
export PYTHONPATH=$HVD_TARGET
unset HOROVOD_CONTROLLER HOROVOD_CPU_OPERATIONS HOROVOD_GLOO_IFACE
fw_both horovod -- "$python" "$root/tests/python/lane.py" horovod "$work/horovod"
