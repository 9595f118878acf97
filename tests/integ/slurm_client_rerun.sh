#!/bin/bash
# gpurun rerun on the Slurm test cluster: an ended 2-node job submitted again from the
# job.sbatch its job dir keeps: a new id, the same script (job.sbatch byte for byte, the
# same directives: name, nodes), run to COMPLETED with --wait; the ranks see the new job's
# id. A running job and a job without a dir are refused, each with the way; a local job runs
# again here, its command line said. And a SCRIPT.py whose rank lacks a module
# ends gpurun --wait with the line that names the Python it ran.
# timeout: 120
# lane: side
set -euo pipefail
# shellcheck source=slurm_client_common.sh
. "$(dirname "$0")/slurm_client_common.sh"

# shellcheck disable=SC2016 # expanded by each rank
run first.out first.err --wait -N 2 --gpus-per-node 1 -J again -- sh -c \
    'echo "job $SLURM_JOB_ID rank $RANK of $WORLD_SIZE"'
expect_rc "gpurun --wait" 0
id1=$(job_id first.out)
[ -n "$id1" ] || grs_fail "no job id: $(cat first.out first.err)"
grep -qxF "[1] job $id1 rank 1 of 2" first.out || grs_fail "first run's output: $(cat first.out)"
[ -f "$GPURUN_JOBS/$id1/job.sbatch" ] || grs_fail "job $id1 kept no job.sbatch"

run re.out re.err rerun "$id1" --wait
expect_rc "gpurun rerun --wait" 0
id2=$(job_id re.out)
if [ -z "$id2" ] || [ "$id2" = "$id1" ]; then
    grs_fail "rerun's job id '$id2' (first $id1): $(cat re.out re.err)"
fi
for r in 0 1; do
    grep -qxF "[$r] job $id2 rank $r of 2" re.out || grs_fail "rerun's rank $r: $(cat re.out re.err)"
done
cmp -s "$GPURUN_JOBS/$id1/job.sbatch" "$GPURUN_JOBS/$id2/job.sbatch" ||
    grs_fail "job $id2 ran another script: $(diff "$GPURUN_JOBS/$id1/job.sbatch" "$GPURUN_JOBS/$id2/job.sbatch")"
run st.json st.err status "$id2" --json
expect_rc "gpurun status of the rerun" 0
[ "$(json st.json 'v["state"], v["slurm"]["name"], v["slurm"]["nodes"]')" = \
    "('COMPLETED', 'again', ['node1', 'node2'])" ] || grs_fail "status of job $id2: $(head -c 600 st.json)"
# The first job's dir is untouched.
grep -qF "\"job_id\": \"$id1\"" "$GPURUN_JOBS/$id1/job.json" || grs_fail "job $id1's job.json changed"

# A job that has not ended is refused: its script would run twice at once.
run run.out run.err -N 1 --gpus-per-node 1 --kill-grace 1 -- sleep 3007
expect_rc "gpurun" 0
id3=$(job_id run.out)
wait_running "$id3" 1
run busy.out busy.err rerun "$id3"
expect_rc "gpurun rerun of a running job" 125
grep -qxF "gpurun: job $id3 is RUNNING: only a job that has ended is submitted again (gpurun cancel $id3 first, or wait for its end: gpurun status $id3 --watch)" busy.err ||
    grs_fail "rerun of a running job says: $(cat busy.err)"
[ ! -s busy.out ] || grs_fail "rerun of a running job submitted: $(cat busy.out)"
run cancel.out cancel.err cancel "$id3"
expect_rc "gpurun cancel" 0

# A job whose script never ran has no job.sbatch.
run none.out none.err rerun 4000000
expect_rc "gpurun rerun of an unknown job" 125
grep -qxF "gpurun: job 4000000 has no job dir '$GPURUN_JOBS/4000000': its batch script never ran (or the dir was removed), so there is no job.sbatch to submit again" none.err ||
    grs_fail "rerun of an unknown job says: $(cat none.err)"

# A local job has no batch script: it runs again here, with the same options.
mkdir -p here
# shellcheck disable=SC2016 # expanded by the rank
(cd here && timeout 60 "$gpurun" --local --gpus-per-node 2 -J loc --export 'GREETING=hi there' -- \
    sh -c 'echo "$GREETING"' >"$GRS_WORK/loc.out" 2>"$GRS_WORK/loc.err") || grs_fail "gpurun --local: $(cat loc.err)"
lid=$(sed -n 's/^gpurun: job \(local-[^,]*\), job dir .*/\1/p' loc.err)
[ -n "$lid" ] || grs_fail "no local job id: $(cat loc.err)"
run lre.out lre.err rerun "$lid"
expect_rc "gpurun rerun of a local job" 0
want="gpurun: running local job '$lid' again: cd $GRS_WORK/here && gpurun --local --gpus-per-node 2 --export 'GREETING=hi there' -J loc -- sh -c 'echo \"\$GREETING\"'"
grep -qxF -- "$want" lre.err || grs_fail "rerun of a local job says: $(cat lre.err); expected: $want"
[ "$(grep -c '^\[[01]\] hi there$' lre.out)" = 2 ] || grs_fail "the local job run again printed: $(cat lre.out)"

# A SCRIPT.py whose Python lacks a module: --wait's last line names that Python.
printf 'import gpurun_rerun_no_such_module\n' >nomod.py
run nomod.out nomod.err --wait -N 1 --gpus-per-node 1 nomod.py
expect_rc "gpurun --wait nomod.py" 1
grep -q "^gpurun: rank 0 has no module 'gpurun_rerun_no_such_module' in Python 'python3' (the first on each node's PATH; here '.*'): activate the venv that has it, or choose a Python with --python PATH\$" nomod.err ||
    grs_fail "--wait of a rank without its module says: $(tail -n 3 nomod.err)"
