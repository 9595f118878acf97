#!/usr/bin/env bash
# The habits an sbatch and torchrun user brings, with the real `gpurun --local`: SCRIPT.py
# (before '--' or as the first word after it) runs with the active venv's Python
# ($VIRTUAL_ENV/bin/python, a wrapper here that marks its output), --python overrides it (a
# relative path made absolute), python3 on PATH without a venv; a stale VIRTUAL_ENV and
# --python without a script are refused with the way; a rank without a module ends the job
# with the line that names the Python it ran and --python. And sbatch's counts: -n over -N,
# --ntasks-per-node, -G, --gpus-per-task 1 give the ranks they say; a count that does not
# split is refused before any job.
# timeout: 120
set -euo pipefail
# shellcheck source=local_common.sh
. "$(dirname "$0")/local_common.sh"

[ -x /usr/bin/python3 ] || skip "no /usr/bin/python3"
unset VIRTUAL_ENV

# job_argv: the last job's argv from its job.json (the "gpurun: job ID, job dir DIR" line),
# as one line of words.
job_argv() {
    local dir
    dir=$(sed -n 's/^gpurun: job [^,]*, job dir \(.*\)$/\1/p' "$work/err")
    [ -f "$dir/job.json" ] || fail "no job dir in: $(cat "$work/err")"
    /usr/bin/python3 -c 'import json, sys; print(" ".join(json.load(open(sys.argv[1]))["argv"]))' \
        "$dir/job.json"
}

# fake_python DIR MARK: DIR/bin/python, a Python that prints MARK first.
fake_python() {
    mkdir -p "$1/bin"
    printf '#!/bin/sh\necho "%s $*"\nexec /usr/bin/python3 "$@"\n' "$2" >"$1/bin/python"
    chmod +x "$1/bin/python"
}

cd "$work"
fake_python venv VENV-PYTHON
fake_python other OTHER-PYTHON
cat >hello.py <<'EOF_PY'
import os, sys
print("hello from rank", os.environ["RANK"], "args", " ".join(sys.argv[1:]))
EOF_PY

# --- the venv's Python -------------------------------------------------------------------------

VIRTUAL_ENV=$work/venv run --local -- hello.py --lr 3
expect_rc 0 "gpurun --local -- hello.py in a venv"
expect_out_line "[0] VENV-PYTHON hello.py --lr 3"
expect_out_line "[0] hello from rank 0 args --lr 3"
[ "$(job_argv)" = "$work/venv/bin/python hello.py --lr 3" ] || fail "job.json argv: $(job_argv)"

VIRTUAL_ENV=$work/venv run --local --gpus-per-node 2 hello.py
expect_rc 0 "gpurun --local hello.py in a venv"
expect_out_line "[1] VENV-PYTHON hello.py"
expect_out_line "[1] hello from rank 1 args "

# --python beats the venv; a relative path is made absolute, links kept (a venv's python is
# a link, which must stay one).
ln -s other other-link
VIRTUAL_ENV=$work/venv run --local --python other-link/bin/python -- hello.py
expect_rc 0 "gpurun --local --python other-link/bin/python"
expect_out_line "[0] OTHER-PYTHON hello.py"
grep -q "VENV-PYTHON" "$work/out" && fail "--python ran the venv's Python too: $(cat "$work/out")"
[ "$(job_argv)" = "$work/other-link/bin/python hello.py" ] || fail "job.json argv with --python: $(job_argv)"

# Without a venv: python3 from PATH, as before.
run --local hello.py
expect_rc 0 "gpurun --local hello.py without a venv"
expect_out_line "[0] hello from rank 0 args "
[ "$(job_argv)" = "python3 hello.py" ] || fail "job.json argv without a venv: $(job_argv)"

# A command after '--' that is not a .py file runs as it is.
VIRTUAL_ENV=$work/venv run --local -- /usr/bin/python3 hello.py
expect_rc 0 "gpurun --local -- /usr/bin/python3 hello.py"
grep -q "VENV-PYTHON" "$work/out" && fail "an explicit interpreter was replaced: $(cat "$work/out")"

# --- refused with the way ----------------------------------------------------------------------

VIRTUAL_ENV=$work/gone run --local hello.py
expect_rc 127 "a VIRTUAL_ENV that does not exist"
expect_err "gpurun: VIRTUAL_ENV '$work/gone': '$work/gone/bin/python': no such file (activate a venv that exists, or deactivate it, or give --python PATH)"
run --local --python /nonexistent/python hello.py
expect_rc 127 "--python that does not exist"
expect_err "gpurun: --python '/nonexistent/python': no such file (give the path of a Python, e.g. --python /usr/bin/python3)"
run --local --python /usr/bin/python3 -- true
expect_rc 125 "--python without a script"
expect_err "gpurun: --python '/usr/bin/python3': the job runs no SCRIPT.py (with '-- CMD', name the interpreter as CMD)"

# --- a rank without its module -----------------------------------------------------------------

printf 'print("starting")\nimport gpurun_habits_no_such_module\n' >nomod.py
VIRTUAL_ENV=$work/venv run --local nomod.py
expect_rc 1 "a rank without its module"
expect_err "gpurun: rank 0 has no module 'gpurun_habits_no_such_module' in Python '$work/venv/bin/python' (the active venv's, VIRTUAL_ENV): install 'gpurun_habits_no_such_module' there, or choose another Python with --python PATH"
# The line comes last, after the job's own.
tail -n 1 "$work/err" | grep -q "^gpurun: rank 0 has no module " || fail "the hint is not the last line: $(tail -n 2 "$work/err")"
run --local --python "$work/other/bin/python" nomod.py
expect_rc 1 "a rank without its module, --python"
expect_err "gpurun: rank 0 has no module 'gpurun_habits_no_such_module' in Python '$work/other/bin/python' (--python's): give --python the path of a Python that has it"
# Another failure gets no such line.
printf 'raise SystemExit(3)\n' >fails.py
run --local fails.py
expect_rc 3 "a rank that exits 3"
grep -q "has no module" "$work/err" && fail "a hint for another failure: $(cat "$work/err")"

# --- sbatch's counts ---------------------------------------------------------------------------

# shellcheck disable=SC2016 # expanded by each rank
ranks='echo "rank $RANK of $WORLD_SIZE, $LOCAL_WORLD_SIZE on node $NODE_RANK"'
run --local -N 2 -n 4 -- sh -c "$ranks"
expect_rc 0 "gpurun --local -N 2 -n 4"
expect_out_line "[3] rank 3 of 4, 2 on node 1"
run --local --ntasks-per-node 3 -- sh -c "$ranks"
expect_rc 0 "gpurun --local --ntasks-per-node 3"
expect_out_line "[2] rank 2 of 3, 3 on node 0"
run --local -G 4 --gpus-per-node 2 --gpus-per-task 1 -- sh -c "$ranks"
expect_rc 0 "gpurun --local -G 4 --gpus-per-node 2"
expect_out_line "[3] rank 3 of 4, 2 on node 1"
run --local -N 3 -n 4 -- sh -c "$ranks"
expect_rc 125 "gpurun --local -N 3 -n 4"
expect_err "gpurun: --ntasks 4 cannot be split evenly over --nodes 3: gpurun runs as many ranks on every node; give a multiple of 3 (3 or 6)"
[ ! -s "$work/out" ] || fail "a refused count ran ranks: $(cat "$work/out")"
