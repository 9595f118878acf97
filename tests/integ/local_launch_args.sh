#!/usr/bin/env bash
# torch.distributed.launch's scripts under `gpurun --local`, with a real argparse: an
# Apex-era script that reads --local_rank from its arguments fails without it, with the line
# that names --local-rank-arg; with it each rank gets its own, after the script and before
# the script's arguments (torch's own place for it), in either spelling; a --local_rank the
# command gives every rank is refused, or replaced with each rank's under --local-rank-arg;
# --use_env is taken; a command that is not Python gets it after its name.
# timeout: 120
set -euo pipefail
# shellcheck source=local_common.sh
. "$(dirname "$0")/local_common.sh"

[ -x /usr/bin/python3 ] || skip "no /usr/bin/python3"
unset VIRTUAL_ENV

# The habit of Apex-era scripts: argparse's --local_rank, asserted.
cat >"$work/apex.py" <<'EOF'
import argparse
import os

p = argparse.ArgumentParser()
p.add_argument("--local_rank", type=int, default=None)
p.add_argument("--lr", type=float, default=0.0)
a = p.parse_args()
assert a.local_rank is not None, "launch with torch.distributed.launch"
print("local_rank %d LOCAL_RANK %s lr %g" % (a.local_rank, os.environ["LOCAL_RANK"], a.lr))
EOF
# torch 2's spelling, required.
cat >"$work/torch2.py" <<'EOF'
import argparse

p = argparse.ArgumentParser()
p.add_argument("--local-rank", type=int, required=True)
print("local-rank %d" % p.parse_args().local_rank)
EOF

# Without the option: the rank fails, and gpurun names the option.
run --local --gpus-per-node 2 -- /usr/bin/python3 "$work/apex.py" --lr 3
expect_rc 1 "an Apex-era script without --local-rank-arg"
grep -q "^gpurun: rank [01] looked for --local_rank in its arguments (torch.distributed.launch's way): add --local-rank-arg" "$work/err" ||
    fail "no hint naming --local-rank-arg: $(tail -3 "$work/err")"

# With it: each rank its own, the script's own arguments kept.
run --local --gpus-per-node 2 --local-rank-arg "$work/apex.py" --lr 3
expect_rc 0 "--local-rank-arg"
expect_out_line "[0] local_rank 0 LOCAL_RANK 0 lr 3"
expect_out_line "[1] local_rank 1 LOCAL_RANK 1 lr 3"

# torch 2's spelling, and --use_env taken as the no-op it is.
run --local --gpus-per-node 2 --use_env --local-rank-arg=local-rank -- /usr/bin/python3 -u "$work/torch2.py"
expect_rc 0 "--local-rank-arg=local-rank"
expect_out_line "[0] local-rank 0"
expect_out_line "[1] local-rank 1"

# A --local_rank on the command line would give every rank the same: refused before any job.
run --local --gpus-per-node 2 "$work/apex.py" --local_rank 0 --lr 3
expect_rc 125 "--local_rank 0 for every rank"
expect_err "gpurun: the command gives every rank '--local_rank 0': drop it and add --local-rank-arg, which passes each rank its own"
[ ! -s "$work/out" ] || fail "a rank ran: $(cat "$work/out")"
# ... and replaced by each rank's own with --local-rank-arg.
run --local --gpus-per-node 2 --local-rank-arg "$work/apex.py" --local_rank=0 --lr 2
expect_rc 0 "--local-rank-arg over --local_rank=0"
expect_out_line "[0] local_rank 0 LOCAL_RANK 0 lr 2"
expect_out_line "[1] local_rank 1 LOCAL_RANK 1 lr 2"

# Not Python: after the command's name, as torch.distributed.launch --no-python does.
run --local -N 2 --local-rank-arg -- echo a b
expect_rc 0 "--local-rank-arg with a command"
expect_out_line "[0] --local_rank=0 a b"
expect_out_line "[1] --local_rank=0 a b"

# A train.cfg reads LOCAL_RANK itself.
run --local --local-rank-arg jobs/tiny.cfg
expect_rc 125 "--local-rank-arg with a train.cfg"
expect_err "gpurun: --local-rank-arg is for a script or '-- CMD': gpurun-train reads LOCAL_RANK itself"
echo "# --local-rank-arg, --use_env and the hint ok"
