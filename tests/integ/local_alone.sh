#!/usr/bin/env bash
# A job whose ranks never met is said, not "completed" in silence: several Python ranks that
# neither connect to MASTER_ADDR:MASTER_PORT nor use gpurun's store end with the end line,
# summary.json ("ranks_met": false, "alone") and `gpurun status` saying so, with the fix
# (fairseq's distributed_world_size for a fairseq command, MPI's launchers for an mpi4py
# script, a singleton under gpurun); --require-rendezvous makes it a
# failure. Ranks that met through torch's env:// rendezvous (real torch, gloo) or gpurun's
# store are not named; nor is a shell command, nor one rank.
# timeout: 180
set -euo pipefail
# shellcheck source=local_common.sh
. "$(dirname "$0")/local_common.sh"

[ -x /usr/bin/python3 ] || skip "no /usr/bin/python3"
py=/usr/bin/python3

# summary_of: the last job's summary.json (the "gpurun: job ID, job dir DIR" line).
summary_of() {
    local dir
    dir=$(sed -n 's/^gpurun: job [^,]*, job dir \(.*\)$/\1/p' "$work/err")
    [ -f "$dir/summary.json" ] || fail "no summary.json in: $(cat "$work/err")"
    echo "$dir/summary.json"
}
# field KEY: the last job's summary.json's KEY, as Python prints it.
field() {
    "$py" -c 'import json, sys; print(json.load(open(sys.argv[1])).get(sys.argv[2]))' \
        "$(summary_of)" "$1"
}
end_line() {
    grep "^gpurun: job '.*' \(completed\|exited\)" "$work/err" || true
}

# Two Python ranks that never meet.
run --local --gpus-per-node 2 -- "$py" -c 'print("alone")'
expect_rc 0 "ranks that never met, without --require-rendezvous"
end_line | grep -q "completed in [0-9.]* s, but the 2 ranks never met: none connected to MASTER_ADDR:MASTER_PORT nor used gpurun's store, so each trained alone; " ||
    fail "the end line does not say the ranks never met: $(end_line)"
[ "$(field ranks_met)" = False ] || fail "summary.json's ranks_met: $(field ranks_met)"
field alone | grep -q "init_process_group" || fail "summary.json's alone: $(field alone)"
id=$(sed -n 's/^gpurun: job \([^,]*\), job dir .*$/\1/p' "$work/err")
"$gpurun" status "$id" >"$work/status" 2>&1 || fail "gpurun status $id: $(cat "$work/status")"
grep -q '^warning: the 2 ranks never met' "$work/status" || fail "status: $(cat "$work/status")"

# --require-rendezvous: a failure, gpurun's own status.
run --local --gpus-per-node 2 --require-rendezvous -- "$py" -c 'print("alone")'
expect_rc 125 "--require-rendezvous"
[ "$(field outcome)" = failed ] || fail "outcome $(field outcome) with --require-rendezvous"
"$py" -c 'import json, sys; ff = json.load(open(sys.argv[1]))["first_failure"]; assert ff["class"] == "user-error" and "never met" in ff["cause"], ff' \
    "$(summary_of)" || fail "first_failure with --require-rendezvous"

# fairseq's entry point (a Python script on PATH, as pip installs it): fairseq's fix.
mkdir -p "$work/bin"
printf '#!%s\nprint("fairseq, world size 1")\n' "$py" >"$work/bin/fairseq-hydra-train"
chmod +x "$work/bin/fairseq-hydra-train"
PATH=$work/bin:$PATH run --local --gpus-per-node 2 -- fairseq-hydra-train -m --config-dir c
expect_rc 0 "fairseq"
end_line | grep -q "add distributed_training.distributed_world_size=2 to its command; logs in" ||
    fail "no fairseq fix on the end line: $(end_line)"

# An mpi4py script (Debian's python3-mpi4py, Open MPI): MPI_Init in a rank gpurun started is
# a singleton, a world of 1, whatever mpirun's variables say; the fix names MPI's launchers.
# The script is named relative to the job's working directory.
if "$py" -c 'import mpi4py' >/dev/null 2>&1; then
    cat >"$work/mpi_world.py" <<'PY'
import os
from mpi4py import MPI
print("mpi4py world %d, OMPI_COMM_WORLD_RANK %s of %s" % (MPI.COMM_WORLD.Get_size(),
      os.environ.get("OMPI_COMM_WORLD_RANK"), os.environ.get("OMPI_COMM_WORLD_SIZE")), flush=True)
PY
    cd "$work"
    run --local --gpus-per-node 2 -- "$py" mpi_world.py
    cd "$root"
    expect_rc 0 "mpi4py ranks"
    for r in 0 1; do
        expect_out_line "[$r] mpi4py world 1, OMPI_COMM_WORLD_RANK $r of 2"
    done
    end_line | grep -q "never met: .*; an MPI program's ranks started by gpurun are MPI singletons, each a world of 1 (MPI_Init finds no process manager): start it with mpirun or srun --mpi=pmix, or join its 2 ranks with torch.distributed (env://); logs in" ||
        fail "no MPI fix on the end line: $(end_line)"
else
    echo "# mpi4py not importable (python3-mpi4py): its case not run"
fi

# gpurun's store: they met.
run --local --gpus-per-node 2 -- "$py" -c 'import gpurun; gpurun.set("k%d" % gpurun.rank(), "v")'
expect_rc 0 "ranks that use the store"
end_line | grep -q "never met" && fail "ranks that used the store were called alone: $(end_line)"
[ "$(field ranks_met)" = True ] || fail "store: ranks_met $(field ranks_met)"

# A shell on every rank, or one Python rank: nothing to say.
run --local --gpus-per-node 2 -- sh -c 'echo hi'
expect_rc 0 "sh"
end_line | grep -q "never met" && fail "a shell command was called alone: $(end_line)"
run --local -- "$py" -c 'print(1)'
expect_rc 0 "one rank"
end_line | grep -q "never met" && fail "one rank was called alone: $(end_line)"

# torch's env:// rendezvous with gloo: they met through MASTER_PORT.
if "$py" -c 'import torch.distributed as d; assert d.is_available() and d.is_gloo_available()' \
    >/dev/null 2>&1; then
    run --local --gpus-per-node 2 --require-rendezvous -- "$py" "$root/tests/ranks/torch_allreduce.py"
    expect_rc 0 "torch gloo ranks (--require-rendezvous)"
    end_line | grep -q "never met" && fail "torch ranks were called alone: $(end_line)"
    [ "$(field ranks_met)" = True ] || fail "torch: ranks_met $(field ranks_met)"
else
    echo "# torch with gloo not importable: its case not run"
fi
echo "# ranks that never met said; store, torch, shell and one rank not"
