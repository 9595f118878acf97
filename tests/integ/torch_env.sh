#!/bin/bash
# torchrun's contract under `gpurun --local`, read by a real torch program: every variable
# torch's own agent sets (torch/distributed/elastic/agent/server/local_elastic_agent.py) with
# its value, every GPU of the node visible to every rank (and one each with
# --gpu-bind=single), and a rank's exception recorded by torch's @record in
# TORCHELASTIC_ERROR_FILE reaching the first-failure report and `gpurun status`. Uses Debian's
# python3-torch (/usr/bin/python3, or $TORCH_PYTHON); skips without it.
# timeout: 180
set -euo pipefail
# shellcheck source=local_common.sh
. "$(dirname "$0")/local_common.sh"

python=${TORCH_PYTHON:-/usr/bin/python3}
[ -x "$python" ] || skip "no '$python'"
"$python" -c 'import importlib.util as u; assert u.find_spec("torch")' >/dev/null 2>&1 ||
    skip "'$python' has no torch (Debian's python3-torch)"
"$python" -c 'import torch.distributed.elastic.multiprocessing.errors' >/dev/null 2>&1 ||
    skip "'$python' cannot import torch's elastic error handler"

# json FILE EXPR: the Python expression EXPR of the JSON in FILE (as v).
json() {
    "$python" -c 'import json, sys; v = json.load(open(sys.argv[1])); print(eval(sys.argv[2]))' "$1" "$2"
}

job=$work/rec
export CUDA_VISIBLE_DEVICES=4,5
run --local -N 2 --gpus-per-node 2 --max-restarts 0 --job-dir "$job" \
    -- "$python" "$root/tests/ranks/torch_record.py"
expect_rc 1 "a job whose rank 1 raises under @record"

# The environment, rank by rank, as torchrun would give it (one role, "default").
for r in 0 1 2 3; do
    line=$(grep "^\[$r\] env " "$work/out") || fail "rank $r printed no environment"
    node=$((r / 2))
    for kv in "RANK=$r" "LOCAL_RANK=$((r % 2))" WORLD_SIZE=4 LOCAL_WORLD_SIZE=2 \
        "GROUP_RANK=$node" GROUP_WORLD_SIZE=2 ROLE_NAME=default "ROLE_RANK=$r" \
        ROLE_WORLD_SIZE=4 MASTER_ADDR=127.0.0.1 TORCHELASTIC_RESTART_COUNT=0 \
        TORCHELASTIC_MAX_RESTARTS=0 "TORCHELASTIC_RUN_ID=$(json "$job/job.json" 'v["job_id"]')" \
        TORCHELASTIC_USE_AGENT_STORE=False TORCH_NCCL_ASYNC_ERROR_HANDLING=1 \
        PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 CUDA_VISIBLE_DEVICES=4,5; do
        grep -qF " $kv" <<<" ${line#*env }" || fail "rank $r: no $kv in: $line"
    done
    grep -qE " MASTER_PORT=[0-9]+" <<<"$line" || fail "rank $r: no MASTER_PORT: $line"
    grep -qE " OMP_NUM_THREADS=[1-9][0-9]*" <<<"$line" || fail "rank $r: no OMP_NUM_THREADS: $line"
    grep -qxF "[$r] error file rank-$r.error.json" "$work/out" || fail "rank $r's error file name"
done
echo "# torchrun's variables: every rank, every value; all GPUs visible to every rank"

# The exception: in the first-failure report, summary.json and gpurun status.
grep -q "error: job failed: rank 1 on node 0 ('[^']*') exited with status 1: ValueError: bad batch on rank 1 (.*torch_record.py:[0-9]*)" \
    "$work/err" || fail "the failure line does not name the exception and where it was raised"
[ "$(json "$job/summary.json" 'v["first_failure"]["error"]["type"]')" = ValueError ] ||
    fail "summary.json's first failure has no ValueError"
want_line=$(grep -n 'raise ValueError' "$root/tests/ranks/torch_record.py" | cut -d: -f1)
[ "$(json "$job/summary.json" 'v["first_failure"]["error"]["line"]')" = "$want_line" ] ||
    fail "the exception's line is not $want_line (where it was raised)"
"$gpurun" status --job-dir "$job" >"$work/st.out" 2>&1 || true
grep -qE "^exception: ValueError: bad batch on rank 1 \(.*torch_record.py:$want_line\)$" "$work/st.out" ||
    fail "gpurun status lacks the exception: $(head -c 800 "$work/st.out")"
echo "# @record's ValueError (torch_record.py:$want_line) in the failure line, summary.json and status"

# --gpu-bind=single: one GPU each, the LOCAL_RANK-th of the node's.
# shellcheck disable=SC2016 # expanded by each rank
run --local --gpus-per-node 2 --gpu-bind=single -- sh -c 'echo "gpus $CUDA_VISIBLE_DEVICES"'
expect_rc 0 "--gpu-bind=single"
expect_out_line "[0] gpus 4"
expect_out_line "[1] gpus 5"
echo "# --gpu-bind=single: rank 0 sees 4, rank 1 sees 5"

# A restart changes what torchrun's does: TORCHELASTIC_RESTART_COUNT counts up, the rest of
# the contract stays. Generation 0's rank 1 fails; generation 1 succeeds.
# shellcheck disable=SC2016 # expanded by each rank
run --local --gpus-per-node 2 --max-restarts 2 --restart-on all -- sh -c \
    'echo "gen $TORCHELASTIC_RESTART_COUNT of $TORCHELASTIC_MAX_RESTARTS run $TORCHELASTIC_RUN_ID rank $RANK"
     [ "$TORCHELASTIC_RESTART_COUNT" = 0 ] && [ "$RANK" = 1 ] && exit 3; exit 0'
expect_rc 0 "a job restarted once"
id=$(sed -n 's/^gpurun: job \([^,]*\), job dir .*/\1/p' "$work/err")
for r in 0 1; do
    for g in 0 1; do
        grep -qxF "[$r] gen $g of 2 run $id rank $r" "$work/out" ||
            fail "rank $r lacks generation $g's line: $(grep "^\[$r\]" "$work/out" | tr '\n' '|')"
    done
done
echo "# a restart: TORCHELASTIC_RESTART_COUNT 0 then 1, the same run id"
