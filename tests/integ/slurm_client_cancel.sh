#!/bin/bash
# Cancelling on the Slurm test cluster: gpurun cancel of a running 2-node job returns once
# its processes are gone; status says CANCELLED, no rank and no rendezvousd of the job is
# left on any node. Then ^C on gpurun --wait cancels its job too, and gpurun dies of SIGINT.
# Last, SIGUSR1 to the batch shell (the route of the pre-timeout --signal=B:USR1) reaches no
# rank that did not ask for it, and with an explicit --signal every rank on every node,
# which end the job cleanly.
# timeout: 120
# lane: side
set -euo pipefail
# shellcheck source=slurm_client_common.sh
. "$(dirname "$0")/slurm_client_common.sh"

# shellcheck disable=SC2016 # expanded by each rank
run sub.out sub.err -N 2 --gpus-per-node 2 --kill-grace 1 -- sh -c 'echo "up $RANK"; exec sleep 3005'
expect_rc "gpurun" 0
id=$(job_id sub.out)
wait_running "$id" 4
[ "$(pgrep -fc '^sleep 3005$')" = 4 ] || grs_fail "not 4 rank processes: $(pgrep -af 'sleep 3005')"
t0=$(grs_now_ms)
run cancel.out cancel.err cancel "$id"
echo "# cancel_ms=$(($(grs_now_ms) - t0))"
expect_rc "gpurun cancel" 0
grep -qxF "gpurun: job $id cancelled" cancel.err || grs_fail "gpurun cancel says: $(cat cancel.err)"
if pgrep -f '^sleep 3005$' >/dev/null || pgrep -f "rendezvousd --job-dir $GPURUN_JOBS/$id " >/dev/null; then
    grs_fail "processes of job $id left after cancel: $(pgrep -af "sleep 3005|$GPURUN_JOBS/$id ")"
fi
run st.json st.err status "$id" --json
expect_rc "gpurun status --json" 0
[ "$(json st.json 'v["state"], v["ended"]')" = "('CANCELLED', True)" ] ||
    grs_fail "status after cancel: $(json st.json 'v["state"], v["slurm"]')"
run st.txt st.err status "$id"
grep -q "^state: CANCELLED" st.txt || grs_fail "status text after cancel: $(head -n 2 st.txt)"
run again.out again.err cancel "$id"
expect_rc "gpurun cancel of an ended job" 0
grep -q "has ended already" again.err || grs_fail "cancel of an ended job says: $(cat again.err)"
run none.out none.err cancel 4000000
expect_rc "gpurun cancel of an unknown job" 125

# ^C on --wait: the job is cancelled, gpurun streams to its end and dies of SIGINT.
# shellcheck disable=SC2016 # expanded by each rank
"$gpurun" --wait -N 2 --gpus-per-node 1 --kill-grace 1 -- sh -c 'echo "up $RANK"; exec sleep 3006' \
    >wait.out 2>wait.err </dev/null &
pid=$!
for ((i = 0; i < 150; i++)); do
    [ "$(grep -c '^\[[01]\] up' wait.out)" = 2 ] && break
    sleep 0.2
done
[ "$(grep -c '^\[[01]\] up' wait.out)" = 2 ] || grs_fail "--wait streamed no rank lines: $(cat wait.out)"
id=$(job_id wait.out)
kill -INT "$pid"
rc=0
wait "$pid" || rc=$?
expect_rc "gpurun --wait after SIGINT" 130
grep -q "cancelling job $id" wait.err || grs_fail "no word of the cancel: $(cat wait.err)"
run st.json st.err status "$id" --json
[ "$(json st.json 'v["state"]')" = CANCELLED ] || grs_fail "job $id after ^C: $(json st.json 'v["state"]')"
! pgrep -f '^sleep 3006$' >/dev/null || grs_fail "ranks left after ^C: $(pgrep -af 'sleep 3006')"

# The pre-timeout signal, sent to the batch shell only as Slurm sends it (--signal=B:...):
# the shell hands it to the leader through the job dir, the leader to every rendezvousd,
# each rendezvousd to the ranks that asked for it. A shell rank cannot ask, so by default
# it is left alone; with an explicit --signal every rank gets it.
# start_trapper ARGS...: a 2-node job of shell ranks that print "checkpoint" on USR1.
start_trapper() {
    # shellcheck disable=SC2016 # expanded by each rank
    run sub.out sub.err -N 2 --gpus-per-node 1 "$@" -- bash -c \
        'trap "echo checkpoint \$RANK; exit 0" USR1; echo "up $RANK"; while :; do sleep 0.05; done'
    expect_rc "gpurun $*" 0
    id=$(job_id sub.out)
    # A rank prints its line once its trap is set: before, USR1 would simply kill it.
    for ((i = 0; i < 150; i++)); do
        [ "$(grep -c '^\[[01]\] up' "$GPURUN_JOBS/$id.out" 2>/dev/null)" = 2 ] && break
        sleep 0.2
    done
}
start_trapper
scancel --signal=USR1 --batch "$id"
sleep 2
st=$(scontrol -o show job "$id" | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p')
[ "$st" = RUNNING ] || grs_fail "job $id is $st after a USR1 its ranks did not ask for"
grep -q checkpoint "$GPURUN_JOBS/$id.out" && grs_fail "a rank that did not ask got USR1"
grep -q "pre-timeout signal SIGUSR1 to 0 of 1 ranks" "$GPURUN_JOBS/$id.out" ||
    grs_fail "no daemon says it kept USR1 from its ranks: $(tr '\n' '|' <"$GPURUN_JOBS/$id.out")"
scancel "$id"
grs_job_wait "$id" 30 >/dev/null || grs_fail "job $id did not end after scancel"

start_trapper --signal=B:USR1@60
scancel --signal=USR1 --batch "$id"
state=$(grs_job_wait "$id" 30) || grs_fail "job $id did not end within 30 s of SIGUSR1"
[ "$state" = COMPLETED ] || grs_fail "job $id after SIGUSR1 is $state: $(cat "$GPURUN_JOBS/$id.out")"
for r in 0 1; do
    grep -qxF "[$r] checkpoint $r" "$GPURUN_JOBS/$id.out" ||
        grs_fail "rank $r got no SIGUSR1: $(tr '\n' '|' <"$GPURUN_JOBS/$id.out")"
done
echo "# cancel and ^C on --wait: CANCELLED, nothing left on the nodes; the pre-timeout USR1 reaches no unprepared rank, and every rank with --signal"
