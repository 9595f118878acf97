#!/bin/bash
# sbatch's options and variables on the Slurm test cluster: a bad value, a node, feature,
# reservation or GRES the cluster lacks, and SBATCH_PARTITION=nope are each refused in one
# line before anything is submitted; --nodelist, --exclusive, --comment, --chdir, --hold,
# --mem, --mail-type/--mail-user, --dependency, --constraint, --exclude, --mem-per-cpu,
# --begin, --mem-per-gpu, --reservation and --gres are recorded by slurmctld as sbatch's
# would be (scontrol show job) and honoured; sbatch's variables apply under the flags and over a
# train.cfg's [job] keys, and not to --local jobs.
# timeout: 180
# lane: side
set -euo pipefail
# shellcheck source=slurm_client_common.sh
. "$(dirname "$0")/slurm_client_common.sh"

# refused MESSAGE ARGS...: gpurun ARGS fails with 125 and one line, MESSAGE.
refused() {
    local msg=$1
    shift
    run out err "$@"
    expect_rc "gpurun $*" 125
    [ "$(wc -l <err)" = 1 ] || grs_fail "gpurun $*: not one line on stderr: $(cat err)"
    grep -qxF "gpurun: $msg" err || grs_fail "gpurun $*: said '$(cat err)', not '$msg'"
    [ ! -s out ] || grs_fail "gpurun $*: printed '$(cat out)'"
}

# recorded ID TEXT...: slurmctld's record of job ID (scontrol show job) holds each TEXT.
recorded() {
    local id=$1 t
    shift
    scontrol show job "$id" >job.txt || grs_fail "scontrol show job $id failed"
    for t in "$@"; do
        grep -qF -- "$t" job.txt || grs_fail "job $id: no '$t' in: $(cat job.txt)"
    done
}

# submit ARGS...: gpurun ARGS submits; sets id.
submit() {
    run out err "$@"
    expect_rc "gpurun $*" 0
    id=$(job_id out)
    [ -n "$id" ] || grs_fail "gpurun $*: no job id in '$(cat out)'"
}

# The variable as -p: the will-run check refuses it, as it refuses -p nope.
SBATCH_PARTITION=nope refused "unknown partition 'nope'; nothing submitted" -N 1 -- true
SBATCH_MEM_PER_NODE=10X refused \
    "SBATCH_MEM_PER_NODE: '10X' is not a size (a whole number and K, M, G or T; M by default)" \
    -- true
SBATCH_ARRAY_INX=0-3 refused "SBATCH_ARRAY_INX: '0-3' is refused: a gpurun job is one rendezvous of all its ranks, not an array of jobs; submit one gpurun per task instead (a shell loop, each with --export TASK=N)" \
    -- true
refused "--array: '0-3' is refused: a gpurun job is one rendezvous of all its ranks, not an array of jobs; submit one gpurun per task instead (a shell loop, each with --export TASK=N)" \
    --array 0-3 -- true
refused "--mem: '10X' is not a size (a whole number and K, M, G or T; M by default)" \
    --mem 10X -- true
refused "--dependency: 'foo': 'foo' is not after, afterany, afterburstbuffer, aftercorr, afternotok, afterok or singleton" \
    --dependency foo -- true
refused "--begin: 'yesterday-ish' is not a time (sbatch's forms: HH:MM[:SS], now+N[minutes|hours|days|weeks], YYYY-MM-DD[THH:MM[:SS]], MM/DD[/YY], today, tomorrow, midnight, noon)" \
    --begin yesterday-ish -- true
refused "--constraint: 'nofeature': invalid feature specification; nothing submitted" \
    -C nofeature -- true
refused "--nodelist: 'node9': invalid node name specified; nothing submitted" -w node9 -- true
refused "--exclude: 'node9': invalid node name specified; nothing submitted" -x node9 -- true
refused "--gres: 'fpga:1': invalid generic resource (gres) specification; nothing submitted" \
    --gres fpga:1 -- true
refused "--reservation: 'nope': requested reservation is invalid; nothing submitted" \
    --reservation nope -- true
refused "Slurm cannot give 1 node with 1 GPU and 1 CPU each (--cpus-per-gpu 1 x 1 rank), --mem=99G (requested node configuration is not available); nothing submitted" \
    --mem 99G -- true
refused "--nodelist: 'node[1-2]' names 2 nodes, more than the job's 1" -N 1 -w 'node[1-2]' -- true
refused "--nodelist: 'node[1-3]' names 3 nodes, more than the job's 2 (with its spares)" \
    -N 1 --spare-nodes 1 -w 'node[1-3]' -- true
out=$(scontrol -o show jobs 2>&1)
[[ $out == "No jobs in the system" ]] || grs_fail "jobs after the refusals: $out"

# Without -N, the nodes of -w are the job's, as with sbatch.
run out err -w 'node[2-3]' --wait -- hostname
expect_rc "gpurun -w 'node[2-3]' --wait" 0
for n in 2 3; do
    grep -qxF "[$((n - 2))] node$n" out || grs_fail "no rank on node$n: $(cat out)"
done

# A held job on node2 alone, in a directory of its own (its relative -o too, as sbatch
# has it), with a comment and mail.
mkdir wd
submit -N 1 -w node2 --exclusive --comment "options test" -D wd -o held.out --hold --mem 1G \
    --mail-type END,FAIL --mail-user someone -J held -- pwd
held=$id
recorded "$held" "Priority=0 " "Reason=JobHeldUser" "ReqNodeList=node2" "OverSubscribe=NO" \
    "Comment=gpurun: options test" "WorkDir=$GRS_WORK/wd" "StdOut=$GRS_WORK/wd/held.out" \
    "MinMemoryNode=1G" "MailUser=someone MailType=END,FAIL"
# One that waits for it, on an even node that is not node1, with memory per CPU.
submit -d "afterok:$held" -C even -x node1 --mem-per-cpu 100 -- true
after=$id
recorded "$after" "Reason=Dependency" "Dependency=afterok:$held(unfulfilled)" "Features=even" \
    "ExcNodeList=node1" "MinMemoryCPU=100M"
sleep 1
recorded "$held" "JobState=PENDING"
recorded "$after" "JobState=PENDING"
scontrol release "$held" || grs_fail "scontrol release $held failed"
state=$(grs_job_wait "$held" 60) || grs_fail "job $held did not end within 60 s"
[ "$state" = COMPLETED ] || grs_fail "job $held is $state: $(cat wd/held.out)"
recorded "$held" "NodeList=node2"
grep -qxF "[0] $GRS_WORK/wd" wd/held.out ||
    grs_fail "the rank of job $held did not run in '$GRS_WORK/wd': $(cat wd/held.out)"
state=$(grs_job_wait "$after" 60) || grs_fail "job $after did not end within 60 s"
[ "$state" = COMPLETED ] || grs_fail "job $after is $state: $(cat "$GPURUN_JOBS/$after.out")"
recorded "$after" "NodeList=node2"
# Its comment still marks it as gpurun's.
run list.txt list.err status
grep -qE "^$held +held +COMPLETED " list.txt || grs_fail "the job list lacks $held: $(cat list.txt)"

# GRES besides the GPUs (the test nodes have two nvme each), and without GPUs.
run out err --gres nvme:1 --wait -- true
expect_rc "gpurun --gres nvme:1 --wait" 0
recorded "$(job_id out)" "TresPerNode=gres:gpu:1,gres:nvme:1"
run out err --no-gpus --gres nvme:2 --wait -- true
expect_rc "gpurun --no-gpus --gres nvme:2 --wait" 0
recorded "$(job_id out)" "TresPerNode=gres:nvme:2"

# Not before an hour from now; memory per GPU.
submit --begin now+1hour --mem-per-gpu 200M -- true
recorded "$id" "Reason=BeginTime" "MemPerTres=gres:gpu:200"
! grep -qF "EligibleTime=Unknown" job.txt || grs_fail "job $id has no begin time: $(cat job.txt)"
run out err cancel "$id"
expect_rc "gpurun cancel $id" 0

# In a reservation of node3.
scontrol create reservation ReservationName=gr_resv Nodes=node3 StartTime=now Duration=10 \
    Users="$(id -un)" >/dev/null || grs_fail "cannot create a reservation"
run out err --reservation gr_resv --wait -- hostname
expect_rc "gpurun --reservation gr_resv --wait" 0
grep -qxF "[0] node3" out || grs_fail "the job in gr_resv did not run on node3: $(cat out)"
recorded "$(job_id out)" "Reservation=gr_resv"

# sbatch's variables where no flag says otherwise.
SBATCH_EXCLUSIVE=user SBATCH_TIMELIMIT=7 SBATCH_JOB_NAME=fromenv \
    run out err -J flagname --wait -- true
expect_rc "gpurun with SBATCH_* set" 0
recorded "$(job_id out)" "JobName=flagname" "TimeLimit=00:07:00" "OverSubscribe=USER"
# flag > variable > train.cfg [job] > default, in the script gpurun would submit.
cfg=$here/../../jobs/tiny.cfg # [job] time = 10
# directives FILE WANT...: FILE's partition and time directives are WANT.
directives() {
    local got
    got=$(grep -E '^#SBATCH --(partition|time)=' "$1" | tr '\n' ' ')
    shift
    [ "$got" = "$* " ] || grs_fail "directives '$got', not '$* '"
}
run s1 err --emit-sbatch "$cfg" job.partition=cfgpart
expect_rc "gpurun --emit-sbatch tiny.cfg" 0
directives s1 "#SBATCH --time=0:10:00" "#SBATCH --partition=cfgpart"
SBATCH_PARTITION=envpart SBATCH_TIMELIMIT=20 run s2 err --emit-sbatch "$cfg" job.partition=cfgpart
expect_rc "gpurun --emit-sbatch tiny.cfg with SBATCH_*" 0
directives s2 "#SBATCH --time=0:20:00" "#SBATCH --partition=envpart"
SBATCH_PARTITION=envpart SBATCH_TIMELIMIT=20 run s3 err --emit-sbatch -p flagpart -t 30 "$cfg" \
    job.partition=cfgpart
expect_rc "gpurun --emit-sbatch -p -t tiny.cfg with SBATCH_*" 0
directives s3 "#SBATCH --time=0:30:00" "#SBATCH --partition=flagpart"
# They are sbatch's: a local job does not read them. Its ranks run in --chdir's directory.
SBATCH_PARTITION=nope SBATCH_MEM_PER_NODE=10X run out err --local -D wd -- pwd
expect_rc "gpurun --local with SBATCH_* set" 0
grep -qxF "[0] $GRS_WORK/wd" out || grs_fail "the local rank did not run in wd: $(cat out)"
echo "# sbatch's options: refused before submission when bad, recorded and honoured by slurmctld"
