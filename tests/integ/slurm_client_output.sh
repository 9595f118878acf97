#!/bin/bash
# What a Slurm job's output says at its end, on the Slurm test cluster. A job that completed
# after a spare took the place of a SIGKILLed node, one whose rank failed and one whose nodes
# failed pre-flight show none of srun's own messages ("task 1: Killed", "Force Terminated",
# "task 0: Exited with exit code 3") and no word of srun's tasks: the job's record explains
# them. A job whose leader was SIGKILLed (no record), and one whose node 1 was (no spare),
# show srun's lines, and what its "task K" is. ^C on gpurun --wait ends with gpurun's own
# line, "job N cancelled (SIGINT)", with neither srun's nor slurmstepd's word of the cancel.
# timeout: 200
# lane: side
set -euo pipefail
# shellcheck source=slurm_client_common.sh
. "$(dirname "$0")/slurm_client_common.sh"

hint="srun's 'task K' is node K's rendezvousd"

# no_noise WHAT FILE...: fails if the files hold a line of srun's or slurmstepd's, or the hint.
no_noise() {
    local what=$1
    shift
    if grep -hE "^srun: |^slurmstepd|$hint" "$@"; then
        grs_fail "$what: srun's noise in the output (above)"
    fi
}

# wait_lines FILE PATTERN N: waits (up to 30 s) for N lines of FILE matching PATTERN.
wait_lines() {
    local i
    for ((i = 0; i < 150; i++)); do
        [ "$(grep -c "$2" "$1" 2>/dev/null)" = "$3" ] && return 0
        sleep 0.2
    done
    grs_fail "no $3 lines '$2' in $1: $(tail -n 5 "$1")"
}

# A completed job whose node 1 a spare replaced: srun saw its daemon killed.
# shellcheck disable=SC2016 # expanded by each rank
timeout 150 "$gpurun" --wait -N 2 --gpus-per-node 1 --spare-nodes 1 --max-restarts 1 \
    --kill-grace 1 -- sh -c 'echo "gen $GPURUN_RESTART_COUNT rank $RANK"
if [ "$GPURUN_RESTART_COUNT" = 0 ]; then exec sleep 3021; fi' >spare.out 2>spare.err </dev/null &
gpid=$!
wait_lines spare.out '^\[[01]\] gen 0 ' 2
id=$(job_id spare.out)
victim=$(daemon_pid "$id" 1)
[ -n "$victim" ] || grs_fail "no rendezvousd of node 1"
kill -KILL "$victim"
rc=0
wait "$gpid" || rc=$?
expect_rc "gpurun --wait of a job a spare completed" 0
grep -q "^\[1\] gen 1 rank 1" spare.out || grs_fail "generation 1 did not run: $(tail -n 5 spare.err)"
grep -q "gpurun: job $id completed" spare.err || grs_fail "last line: $(tail -n 1 spare.err)"
no_noise "a completed job (a spare swapped in)" spare.out spare.err "$GPURUN_JOBS/$id.out"
grep -q ': task 1: Killed' "$GPURUN_JOBS/$id/srun.log" ||
    grs_fail "srun.log lacks srun's word of the killed daemon: $(cat "$GPURUN_JOBS/$id/srun.log")"
echo "# a spare swapped in, the job completed: no srun lines in its output"

# A rank's failure: the daemon's line names it; srun's "task 1: Exited" would only confuse.
# shellcheck disable=SC2016 # expanded by each rank
run fail.out fail.err --wait -N 2 --gpus-per-node 1 --kill-grace 1 -- sh -c \
    'echo "up $RANK"; [ "$RANK" = 0 ] || exit 3; exec sleep 3022'
expect_rc "gpurun --wait of a failing rank" 3
id=$(job_id fail.out)
grep -qF "job failed: rank 1 on node 1 ('node2') exited with status 3" fail.out ||
    grs_fail "the stream does not name the failing rank: $(grep -v '^\[' fail.out | head -n 5)"
no_noise "a failing rank" fail.out fail.err
echo "# a rank failed: the daemon's line names it, no srun lines"

# Every node fails pre-flight: the leader's line says why; srun's exit lines would not.
run pre.out pre.err --wait -N 2 --gpus-per-node 1 --min-free 1000000000 -- true
expect_rc "gpurun --wait of a job whose nodes fail pre-flight" 125
grep -qF "failed pre-flight: job dir" pre.out || grs_fail "no pre-flight line: $(cat pre.out)"
no_noise "a failed pre-flight" pre.out pre.err
echo "# pre-flight failed: the leader's line, no srun lines"

# Node 1's daemon SIGKILLed without a spare: srun's "task 1: Killed" says what the record's
# lost node met.
# shellcheck disable=SC2016 # expanded by each rank
timeout 150 "$gpurun" --wait -N 2 --gpus-per-node 1 --kill-grace 1 -- sh -c \
    'echo "up $RANK"; exec sleep 3025' >node.out 2>node.err </dev/null &
gpid=$!
wait_lines node.out '^\[[01]\] up' 2
id=$(job_id node.out)
victim=$(daemon_pid "$id" 1)
[ -n "$victim" ] || grs_fail "no rendezvousd of node 1"
kill -KILL "$victim"
rc=0
wait "$gpid" || rc=$?
[ "$rc" != 0 ] || grs_fail "a job that lost node 1 exited 0"
grep -qE "^srun: error: node2: task 1: Killed" node.out ||
    grs_fail "srun's line of the killed daemon is not in the output: $(cat node.out)"
grep -qF "gpurun: $hint, not rank K" node.out || grs_fail "no hint of what srun's task is: $(cat node.out)"
echo "# node 1 killed: srun's line of it and what its task K is"

# The leader SIGKILLed: no record, so srun's lines are the explanation, with the hint.
# shellcheck disable=SC2016 # expanded by each rank
timeout 150 "$gpurun" --wait -N 2 --gpus-per-node 1 --kill-grace 1 -- sh -c \
    'echo "up $RANK"; exec sleep 3023' >lost.out 2>lost.err </dev/null &
gpid=$!
wait_lines lost.out '^\[[01]\] up' 2
id=$(job_id lost.out)
victim=$(daemon_pid "$id" 0)
[ -n "$victim" ] || grs_fail "no rendezvousd of node 0"
kill -KILL "$victim"
rc=0
wait "$gpid" || rc=$?
expect_rc "gpurun --wait of a job whose leader was killed" 125
grep -qE "^srun: error: node1: task 0: Killed" lost.out ||
    grs_fail "srun's line of the killed daemon is not in the output: $(cat lost.out)"
grep -qF "gpurun: $hint, not rank K" lost.out || grs_fail "no hint of what srun's task is: $(cat lost.out)"
echo "# the leader killed: srun's lines and what its task K is"

# ^C on --wait: gpurun's own last line.
# shellcheck disable=SC2016 # expanded by each rank
"$gpurun" --wait -N 2 --gpus-per-node 1 --kill-grace 1 -- sh -c 'echo "up $RANK"; exec sleep 3024' \
    >int.out 2>int.err </dev/null &
gpid=$!
wait_lines int.out '^\[[01]\] up' 2
id=$(job_id int.out)
kill -INT "$gpid"
rc=0
wait "$gpid" || rc=$?
expect_rc "gpurun --wait after SIGINT" 130
last=$(tail -n 1 int.err)
[ "$last" = "gpurun: job $id cancelled (SIGINT); logs in '$GPURUN_JOBS/$id/logs'" ] ||
    grs_fail "the last line after ^C: '$last'"
no_noise "^C on --wait" int.out int.err
! pgrep -f '^sleep 302[1-5]$' >/dev/null || grs_fail "ranks left: $(pgrep -af 'sleep 302[1-5]')"
echo "# ^C: gpurun's own last line, no srun lines"
