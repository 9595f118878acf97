#!/bin/bash
# PyTorch Lightning 1.9.5's DDP (gloo) with gpurun's memory checkpoints
# (gpurun.lightning.GpurunMemCheckpoint, tests/python/lightning_mem_job.py) on the Slurm test
# cluster: 2 nodes of 1 rank, network namespaces of their own. Rank 1 is SIGKILLed in the third
# epoch; gpurun restarts the ranks (--max-restarts 1), both resume from their memory copies of
# the second epoch's end, and the job ends with the parameters of an undisturbed run, bit for
# bit. The framework comes from PyPI (fw_pins.sh): the frameworks lane's copy in the build tree
# where it has the same set, else installed here; skipped where pip cannot.
# timeout: 420
# lane: side
set -euo pipefail

python=${TORCH_PYTHON:-/usr/bin/python3}
if ! "$python" -c 'import importlib.util as u; assert u.find_spec("torch")' >/dev/null 2>&1; then
    echo "# SKIP '$python' has no torch (Debian's python3-torch)"
    exit 77
fi
job=$(cd "$(dirname "$0")/../.." && pwd)/tests/python/lightning_mem_job.py
# shellcheck source=fw_pins.sh
. "$(dirname "$0")/fw_pins.sh"
# shellcheck source=slurm_client_common.sh
. "$(dirname "$0")/slurm_client_common.sh"

deps=${GPURUN_PYDEPS:-$GRS_BUILD/python-deps}/lightning
if [ ! -f "$deps/.stamp" ] || [ "$(cat "$deps/.stamp")" != "${FW_LIGHTNING[*]}" ]; then
    deps=$GRS_WORK/lightning
    rc=0
    timeout -k 5 "${PIP_LIMIT:-300}" "$python" -m pip install --quiet --disable-pip-version-check \
        --no-deps --prefer-binary --no-build-isolation --no-warn-script-location \
        --target "$deps" "${FW_LIGHTNING[@]}" >pip.out 2>&1 || rc=$?
    if [ "$rc" != 0 ]; then
        echo "# SKIP pip install of pytorch-lightning failed ($rc): $(grep -m1 -E 'ERROR|error' pip.out || tail -n 1 pip.out)"
        exit 77
    fi
fi
export PYTHONPATH=$deps PYTHONDONTWRITEBYTECODE=1

# memlane FILE: the job's "memlane" lines, one a rank, by rank.
memlane() {
    sed -nE 's/^\[[0-9]+\] (memlane .*)$/\1/p' "$1" | sort
}

rc=0
timeout 180 "$gpurun" --wait -N 2 --gpus-per-node 1 --kill-grace 1 -- \
    "$python" "$job" calm "$GRS_WORK/calm" >calm.out 2>calm.err </dev/null || rc=$?
[ "$rc" = 0 ] || grs_fail "the undisturbed run exited $rc: $(tail -n 5 calm.err calm.out)"
calm=$(memlane calm.out)
[ "$(grep -c 'steps 32 resumed -1 ' <<<"$calm")" = 2 ] ||
    grs_fail "the undisturbed run: not 2 ranks of 32 steps that never resumed: '$calm'"
digest=$(sed -nE 's/.* params ([0-9a-f]+)$/\1/p' <<<"$calm" | sort -u)
[ "$(grep -c . <<<"$digest")" = 1 ] || grs_fail "the undisturbed run's ranks differ: '$calm'"

rc=0
timeout 180 "$gpurun" --wait -N 2 --gpus-per-node 1 --kill-grace 1 --max-restarts 1 -- \
    "$python" "$job" hit "$GRS_WORK/hit" >hit.out 2>hit.err </dev/null || rc=$?
[ "$rc" = 0 ] || grs_fail "the run whose rank 1 was killed exited $rc: $(tail -n 5 hit.err hit.out)"
for r in 0 1; do
    grep -q "^\[$r\] gpurun: rank $r resumes from its memory checkpoint 'lightning' of step 16$" hit.out ||
        grs_fail "rank $r did not say it resumes from memory at step 16: $(grep "^\[$r\]" hit.out | tail -n 3)"
done
hit=$(memlane hit.out)
[ "$(grep -c "steps 32 resumed 16 params $digest$" <<<"$hit")" = 2 ] ||
    grs_fail "after the restart: not 2 ranks resumed at step 16 ending with the undisturbed run's parameters $digest: '$hit'"
echo "ok - Lightning on Slurm resumed from memory at step 16 of 32 with the undisturbed run's parameters"
