#!/bin/bash
# torch compatibility: an unmodified torch.distributed program (gloo, init_method="env://",
# an all_reduce checked against its sum, a barrier) run by `gpurun --local` with four ranks
# must find everything it needs in the environment rendezvousd gives its ranks. Uses Debian's
# python3-torch (/usr/bin/python3, or $TORCH_PYTHON); skips without it.
# timeout: 240
set -euo pipefail

# shellcheck source=prologue.sh
. "$(dirname "$0")/prologue.sh"
fail_show=(gpurun.out gpurun.err)
python=${TORCH_PYTHON:-/usr/bin/python3}
NPROCS=4

need_built gpurun rendezvousd
[ -x "$python" ] || skip "no '$python'"
# Importing torch takes a second or more: here only look for it; a torch that is found but
# cannot be imported is told apart after a failed run.
"$python" -c 'import importlib.util as u; assert u.find_spec("torch")' >/dev/null 2>&1 ||
    skip "'$python' has no torch (Debian's python3-torch)"
torch_usable() {
    "$python" -c 'import torch.distributed as d; assert d.is_available() and d.is_gloo_available()' \
        >/dev/null 2>&1
}

# gloo on loopback only: nothing leaves the machine and no interface is guessed.
export GLOO_SOCKET_IFNAME=lo
rc=0
t0=$(date +%s%N)
timeout -k 5 180 "$build/gpurun" --local --gpus-per-node "$NPROCS" --job-dir "$work/job" \
    -- "$python" "$root/tests/ranks/torch_allreduce.py" >"$work/gpurun.out" 2>"$work/gpurun.err" || rc=$?
echo "# torch_job_ms=$((($(date +%s%N) - t0) / 1000000))"
[ "$rc" != 124 ] || fail "gpurun did not finish within 180 s"
if [ "$rc" != 0 ]; then
    torch_usable || skip "'$python' cannot import torch.distributed with gloo"
    fail "gpurun exited with status $rc, not 0"
fi

want=$((NPROCS * (NPROCS + 1) / 2))
for ((r = 0; r < NPROCS; r++)); do
    line="torch rank $r/$NPROCS all_reduce $want ok, barrier ok"
    grep -qxF "[$r] $line" "$work/gpurun.out" || fail "gpurun's output lacks '[$r] $line'"
    log=$(find "$work/job" -name "rank-$r.log" -print -quit)
    [ -n "$log" ] || fail "no logs/rank-$r.log in the job dir"
    grep -qxF "$line" "$log" || fail "$log lacks '$line'"
done
echo "# $NPROCS torch ranks: init_process_group(env://), all_reduce, barrier ok"
