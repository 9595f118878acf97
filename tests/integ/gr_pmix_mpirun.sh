#!/bin/bash
# The rank library under PMIx on this machine alone: OpenMPI's mpirun (its own PMIx server,
# no Slurm, no rendezvousd) starts tests/gr_example and tests/gr_pmix_check with four ranks,
# and every rank must print its line.
# timeout: 120
set -euo pipefail

# shellcheck source=prologue.sh
. "$(dirname "$0")/prologue.sh"
fail_show=('*.out' '*.err')
show_lines=20

need_built --hint "make; it needs libpmix" tests/gr_example tests/gr_pmix_check
command -v mpirun >/dev/null || skip "no mpirun (openmpi-bin)"

# mpirun refuses root without these; --oversubscribe: more ranks than this machine's cores.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpirun=(timeout -k 5 60 mpirun --oversubscribe -n 4)

"${mpirun[@]}" "$build/tests/gr_example" --steps 2 >"$work/example.out" 2>"$work/example.err" ||
    fail "mpirun of gr_example exited with status $?"
for ((r = 0; r < 4; r++)); do
    line="rank $r/4 local $r node 0: store ok, barrier ok"
    grep -qxF "$line" "$work/example.out" || fail "gr_example's output lacks '$line'"
done
"${mpirun[@]}" "$build/tests/gr_pmix_check" >"$work/check.out" 2>"$work/check.err" ||
    fail "mpirun of gr_pmix_check exited with status $?"
for ((r = 0; r < 4; r++)); do
    line="gr_pmix_check: rank $r/4 local $r node 0: ok"
    grep -qxF "$line" "$work/check.out" || fail "gr_pmix_check's output lacks '$line'"
done
echo "# gr_example and gr_pmix_check under mpirun: ok"
