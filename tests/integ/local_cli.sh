#!/usr/bin/env bash
# torchrun's command-line habits with the real `gpurun --local`: "SCRIPT.py ARGS" run by
# python3 with every later word the script's, a missing script 127, torchrun's spellings and
# their refusals, "did you mean" for slips; the "gpurun: job ID, job dir DIR" line before the
# ranks' output and status/logs/cancel by that ID (a --job-dir job too); the job's name, time
# limit, --gpu-bind and --signal in job.json (local, and the Slurm spec --emit-sbatch shows);
# the name in `gpurun status`; `gpurun help [SUBCOMMAND]` as --help; the end line of a
# cancelled job; refusals before anything starts (--gpu-bind single with too few GPUs, a
# script's missing #! interpreter, a GPURUN_JOBS that cannot be made); -t 0 as no limit.
# timeout: 180
set -euo pipefail
# shellcheck source=local_common.sh
. "$(dirname "$0")/local_common.sh"

command -v python3 >/dev/null || skip "no python3 on PATH"
# A SCRIPT.py runs with python3 from PATH here (local_habits.sh has the venv's).
unset VIRTUAL_ENV

# job_of FILE: the id and dir of the "gpurun: job ID, job dir DIR" line of FILE, into
# $job_id and $job_dir.
job_of() {
    local line
    line=$(grep -m1 '^gpurun: job ' "$1") || fail "no 'gpurun: job ID, job dir DIR' line in '$1'"
    [[ $line =~ ^gpurun:\ job\ ([^,]+),\ job\ dir\ (/.+)$ ]] ||
        fail "'$line' is not 'gpurun: job ID, job dir DIR' with DIR absolute"
    job_id=${BASH_REMATCH[1]}
    job_dir=${BASH_REMATCH[2]}
    [ -f "$job_dir/job.json" ] || fail "'$job_dir' of '$line' holds no job.json"
}

# expect_json KEY VALUE: the last job's job.json has "KEY": VALUE (VALUE as JSON).
expect_json() {
    grep -qF -- "\"$1\": $2" "$job_dir/job.json" ||
        fail "job.json lacks \"$1\": $2: $(grep -F "\"$1\"" "$job_dir/job.json" || echo none)"
}

cd "$work"
cat >train.py <<'EOF'
import os, sys
print("rank", os.environ["RANK"], "of", os.environ["WORLD_SIZE"], "args", " ".join(sys.argv[1:]))
EOF

# --- SCRIPT.py ARGS, as torchrun takes it --------------------------------------------------

run --local --nproc-per-node 2 train.py --lr 3 -N 5 -- x.cfg
expect_rc 0 "gpurun --local --nproc-per-node 2 train.py ARGS"
expect_out_line "[0] rank 0 of 2 args --lr 3 -N 5 -- x.cfg"
expect_out_line "[1] rank 1 of 2 args --lr 3 -N 5 -- x.cfg"
job_of "$work/err"
[[ $job_id =~ ^local- ]] || fail "local job id '$job_id'"
[ "$job_dir" = "$HOME/.gpurun/jobs/$job_id" ] || fail "job dir '$job_dir', not under ~/.gpurun/jobs"
expect_json name '"train.py"'
tr -d ' \n' <"$job_dir/job.json" | grep -qF '"argv":["python3","train.py","--lr","3","-N","5","--","x.cfg"]' ||
    fail "job.json's argv is not python3 train.py ARGS: $(cat "$job_dir/job.json")"
# What is not given stays as torchrun leaves it: every GPU to every rank, and the
# pre-timeout signal only to the ranks that ask for it.
expect_json gpu_bind 0
expect_json preempt_all 0
expect_json time_limit_s 0

mkdir -p sub
cp train.py sub/pretrain.py
run --local sub/pretrain.py
expect_rc 0 "a script in a subdirectory"
expect_out_line "[0] rank 0 of 1 args "
job_of "$work/err"
expect_json name '"pretrain.py"'

run --local -- python3 train.py --x
expect_rc 0 "'-- python3 train.py'"
expect_out_line "[0] rank 0 of 1 args --x"
job_of "$work/err"
expect_json name '"train.py"'

run --local --job-dir "$work/never" nope.py --lr 3
expect_rc 127 "a script that does not exist"
expect_err "gpurun: 'nope.py': no such file"
[ "$(wc -l <"$work/err")" = 1 ] || fail "more than one line for a missing script"
[ ! -e "$work/never" ] || fail "a job dir was made for a script that does not exist"

# The line comes before the ranks' first words.
timeout -k 5 "$GPURUN_LIMIT" "$gpurun" --local -- sh -c 'echo first words' >"$work/both" 2>&1 ||
    fail "a job with stdout and stderr together failed"
head -n 1 "$work/both" | grep -q '^gpurun: job local-.*, job dir /' ||
    fail "the first line is '$(head -n 1 "$work/both")', not gpurun's job line"
grep -qxF "[0] first words" "$work/both" || fail "the rank's line is missing"

# --- the job's name, time limit, GPU binding and signal ------------------------------------

run --local -J my-run -t 2 --gpu-bind=single --signal=B:USR2@30 -- true
expect_rc 0 "-J -t --gpu-bind --signal"
job_of "$work/err"
named_id=$job_id
expect_json name '"my-run"'
expect_json time_limit_s 120
expect_json gpu_bind 1
expect_json preempt_signal 12
expect_json preempt_all 1

run --local --gpu-bind single:1 -- /bin/true
expect_rc 0 "--gpu-bind single:1"
job_of "$work/err"
expect_json gpu_bind 1
expect_json name '"true"'

run status "$named_id"
expect_rc 0 "gpurun status of a named local job"
expect_out_line "job: $named_id (my-run)"
run status --json "$named_id"
grep -qF '"name": "my-run"' "$work/out" || fail "status --json lacks the name"
run status
expect_rc 0 "gpurun status (the list)"
grep -qE "^$named_id +my-run +COMPLETED " "$work/out" || fail "the list does not show 'my-run'"

# The same keys reach a Slurm job's spec (the batch script carries job.json).
printf '[job]\ntime = 7\njob_name = from-cfg\n[data]\ntrain = x_*.bin\n' >"$work/t.cfg"
run --emit-sbatch "$work/t.cfg"
expect_rc 0 "--emit-sbatch of a train.cfg"
grep -qF '"time_limit_s": 420' "$work/out" || fail "the batch spec lacks [job] time's 420 s"
grep -qF '"name": "from-cfg"' "$work/out" || fail "the batch spec lacks [job] job_name"
run --emit-sbatch -t 1:00:00 --signal=USR1@90 --gpu-bind=single train.py --epochs 2
expect_rc 0 "--emit-sbatch of a script"
for want in '"time_limit_s": 3600' '"name": "train.py"' '"preempt_signal": 10' \
    '"preempt_all": 1' '"gpu_bind": 1' '"python3"' '"--epochs"'; do
    grep -qF -- "$want" "$work/out" || fail "the batch spec lacks $want"
done

# Requeue: --no-requeue by default; --max-requeues N requeues the job from its script N times
# at most, and implies --requeue; SBATCH_REQUEUE stands for --requeue; a contradiction is
# refused before anything is written.
run --emit-sbatch -- true
grep -qx '#SBATCH --no-requeue' "$work/out" || fail "the default script lacks --no-requeue"
! grep -q 'scontrol requeue' "$work/out" || fail "the default script requeues itself"
run --emit-sbatch --max-requeues 3 -- true
expect_rc 0 "--emit-sbatch --max-requeues 3"
grep -qx '#SBATCH --requeue' "$work/out" || fail "--max-requeues without #SBATCH --requeue"
grep -qx '#SBATCH --open-mode=append' "$work/out" || fail "--max-requeues without --open-mode=append"
# shellcheck disable=SC2016 # the script's own text
grep -qF '[ "$requeues" -lt 3 ]' "$work/out" || fail "the script does not bound its requeues by 3"
SBATCH_REQUEUE=1 run --emit-sbatch -- true
grep -qx '#SBATCH --requeue' "$work/out" || fail "SBATCH_REQUEUE did not stand for --requeue"
run --emit-sbatch --no-requeue --requeue -- true
expect_rc 125 "--no-requeue with --requeue"
expect_err "gpurun: --no-requeue: the job also asks to be requeued (--requeue)"

# --- status, logs and cancel by the printed id, for a --job-dir job ------------------------

"$gpurun" --local --job-dir "$work/jd" -J sleeper --kill-grace 1 -- sh -c 'echo up; exec sleep 60' \
    >"$work/job.out" 2>"$work/job.err" </dev/null &
pid=$!
bg_pids+=("$pid")
wait_for_lines "$work/job.out" 1
job_of "$work/job.err"
real_jd=$(cd "$work/jd" && pwd -P)
[ "$job_dir" = "$real_jd" ] || fail "the job line says '$job_dir', not the --job-dir '$real_jd'"
run status "$job_id"
expect_rc 0 "gpurun status ID of a --job-dir job"
expect_out_line "job: $job_id (sleeper)"
expect_out_line "state: RUNNING"
expect_out_line "job dir: $real_jd"
run logs "$job_id"
expect_rc 0 "gpurun logs ID of a --job-dir job"
expect_out_line "[0] up"
run cancel "$job_id"
expect_rc 0 "gpurun cancel ID of a --job-dir job"
rc=0
wait "$pid" || rc=$?
[ "$rc" != 0 ] || fail "the cancelled job's gpurun exited 0"
# Its end line says it was cancelled, with the exit status it keeps (128 + SIGTERM).
[ "$rc" = 143 ] || fail "the cancelled job's gpurun exited $rc, expected 143"
grep -qE "^gpurun: job '$job_id' cancelled \(SIGTERM\), exit status 143; logs in " "$work/job.err" ||
    fail "no 'cancelled (SIGTERM), exit status 143' end line: $(tail -n 2 "$work/job.err")"
run status "$job_id"
expect_out_line "outcome: cancelled"

# --- refused command lines: one line, 125 ---------------------------------------------------

run stauts 12
expect_rc 125 "a misspelt subcommand"
expect_err "gpurun: 'stauts' is not a gpurun command or a file; did you mean 'status'?"
run --local --gpus-per-nod 2 -- true
expect_rc 125 "a misspelt option"
expect_err "gpurun: unknown option '--gpus-per-nod'; did you mean '--gpus-per-node'?"
run --local --nnodes 1:4 train.py
expect_rc 125 "an elastic --nnodes"
expect_err "gpurun: --nnodes: '1:4' is an elastic range, which gpurun does not run: give one number of nodes (--nnodes N), and --max-restarts N to survive failures"
run --local --nproc_per_node=gpu train.py
expect_rc 125 "--nproc_per_node=gpu"
grep -q "^gpurun: --nproc_per_node: 'gpu' is not supported" "$work/err" ||
    fail "no refusal of --nproc_per_node=gpu"
run --local --gpu-bind=closest -- true
expect_rc 125 "--gpu-bind closest"
expect_err "gpurun: --gpu-bind: 'closest' is not none or single"
run --local --signal=B:USR1@x -- true
expect_rc 125 "a bad --signal"
expect_err "gpurun: --signal: 'x' is not a TIME of 0..65535 seconds"
[ "$(wc -l <"$work/err")" = 1 ] || fail "more than one line for a refused command line"

# --- what cannot work is refused before anything starts, saying what is missing ------------

jobs_now() {
    find "$HOME/.gpurun/jobs" -mindepth 1 -maxdepth 1 | wc -l
}
before=$(jobs_now)
CUDA_VISIBLE_DEVICES=0,1 run --local --gpus-per-node 3 --gpu-bind single -- true
expect_rc 125 "--gpu-bind single, 3 ranks, 2 GPUs"
expect_err "gpurun: --gpu-bind single: 3 ranks per node, but CUDA_VISIBLE_DEVICES lists 2 GPUs ('0,1'): local rank 2 would get none; give --gpus-per-node 2 or list more GPUs"
CUDA_VISIBLE_DEVICES=0,1 run --local --gpus-per-node 2 --gpu-bind single \
    --export CUDA_VISIBLE_DEVICES=7 -- true
expect_rc 125 "--gpu-bind single, 2 ranks, --export of 1 GPU"
expect_err "gpurun: --gpu-bind single: 2 ranks per node, but CUDA_VISIBLE_DEVICES (from --export) lists 1 GPU ('7'): local rank 1 would get none; give --gpus-per-node 1 or list more GPUs"
[ "$(jobs_now)" = "$before" ] || fail "a refused --gpu-bind job left a job dir"
# As many GPUs as ranks: each rank its own.
# shellcheck disable=SC2016 # the rank's shell expands it
CUDA_VISIBLE_DEVICES=4,5,6 run --local --gpus-per-node 3 --gpu-bind single -- \
    sh -c 'echo "gpu $CUDA_VISIBLE_DEVICES"'
expect_rc 0 "--gpu-bind single, 3 ranks, 3 GPUs"
expect_out_line "[2] gpu 6"

# A script whose #! interpreter does not exist: not "No such file" of the script.
printf '#!/no/such/python\nprint(1)\n' >badshebang.sh
chmod +x badshebang.sh
before=$(jobs_now)
run --local -- ./badshebang.sh
expect_rc 127 "a script whose #! interpreter does not exist"
expect_err "gpurun: cannot execute './badshebang.sh': its interpreter '/no/such/python' (from its #! line) does not exist"
[ "$(jobs_now)" = "$before" ] || fail "the script with a missing interpreter left a job dir"
# For Slurm, whose nodes may have it, a warning.
run --emit-sbatch -- ./badshebang.sh
expect_rc 0 "--emit-sbatch of a script whose #! interpreter is not here"
expect_err "gpurun: warning: './badshebang.sh': its interpreter '/no/such/python' (from its #! line) does not exist here (the nodes may see other files)"

# A GPURUN_JOBS that cannot be made is named.
: >afile
GPURUN_JOBS=$work/afile/jobs run --local -- true
expect_rc 125 "a GPURUN_JOBS under a file"
expect_err "gpurun: GPURUN_JOBS '$work/afile/jobs': cannot create it: not a directory"
GPURUN_JOBS=$work/afile/jobs run --emit-sbatch -- true
expect_rc 125 "--emit-sbatch with a GPURUN_JOBS under a file"
expect_err "gpurun: GPURUN_JOBS '$work/afile/jobs': cannot create it: not a directory"

# -t 0 is sbatch's "no limit": none here, UNLIMITED asked of Slurm (no -t: the partition's).
run --local -t 0 -- true
expect_rc 0 "-t 0"
job_of "$work/err"
expect_json time_limit_s 0
for t in 0 UNLIMITED; do
    run --emit-sbatch -t "$t" -- true
    expect_rc 0 "--emit-sbatch -t $t"
    grep -qx '#SBATCH --time=UNLIMITED' "$work/out" || fail "-t $t: no '#SBATCH --time=UNLIMITED'"
done
SBATCH_TIMELIMIT=0 run --emit-sbatch -- true
grep -qx '#SBATCH --time=UNLIMITED' "$work/out" || fail "SBATCH_TIMELIMIT=0: no '#SBATCH --time=UNLIMITED'"
run --emit-sbatch -- true
! grep -q '^#SBATCH --time' "$work/out" || fail "no -t asked Slurm for a limit"

run --help
expect_rc 0 "--help"
for want in "--nproc-per-node N" "--gpu-bind MODE" "--signal [B:]SIG[@TIME]" "SCRIPT.py"; do
    grep -qF -- "$want" "$work/out" || fail "--help lacks '$want'"
done
# `gpurun help [SUBCOMMAND]` prints what --help prints.
cp "$work/out" "$work/help.want"
run help
expect_rc 0 "gpurun help"
cmp -s "$work/out" "$work/help.want" || fail "'gpurun help' differs from 'gpurun --help'"
run logs --help
cp "$work/out" "$work/help.want"
run help logs
expect_rc 0 "gpurun help logs"
cmp -s "$work/out" "$work/help.want" || fail "'gpurun help logs' differs from 'gpurun logs --help'"
run help lgos
expect_rc 125 "gpurun help lgos"
expect_err "gpurun: 'lgos': no such subcommand (gpurun's are status, logs, cancel, clean, help, rerun, preflight)"
# The container options: checked before any job, each refusal naming what is wrong.
run --local --container-mounts /a:/b -- true
expect_rc 125 "--container-mounts alone"
expect_err "gpurun: --container-mounts needs --container-image"
run --local --container-image img --container-mounts a:/b -- true
expect_rc 125 "a relative mount source"
expect_err "gpurun: --container-mounts: 'a:/b': the source must be an absolute path"
run --local --container-image img --container-workdir work -- true
expect_rc 125 "a relative --container-workdir"
expect_err "gpurun: --container-workdir 'work': an absolute path inside"
run --local --container-image img --container-env 'A,2B' -- true
expect_rc 125 "a bad --container-env"
expect_err "gpurun: --container-env: '2B' is not a variable's name"
run --local --container-image img --container-runtime lxc -- true
expect_rc 125 "an unknown --container-runtime"
expect_err "gpurun: --container-runtime 'lxc': podman, docker, apptainer (singularity), enroot, pyxis or auto"
echo "# SCRIPT.py ARGS, torchrun's spellings, the job line and ID, name/time/bind/signal ok"
