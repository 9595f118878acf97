#!/bin/bash
# Stops the Slurm test cluster that tests/slurm/up.sh started: cancels its jobs, stops the
# daemons by the pids they wrote (SIGTERM, then SIGKILL for anything left in the cluster's
# namespaces), removes the namespaces, the bridge and the /etc/hosts lines. Idempotent: a
# no-op when nothing is up. The work dir stays, with the logs, until the next up.sh.
#
# usage: tests/slurm/down.sh        (the same GR_SLURM_* settings as up.sh)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/slurm/lib.sh
. "$here/lib.sh"

[ "$(id -u)" = 0 ] || {
    echo "# SKIP stopping the Slurm test cluster needs root"
    exit 77
}
grs_down
