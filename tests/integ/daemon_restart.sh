#!/usr/bin/env bash
# max_restarts: a rank that fails in generations 0 and 1 and succeeds in generation 2 gives a
# completed job with two earlier failures, after 1 s and 2 s of backoff, with a line in every
# rank log where each restart begins; with one restart allowed the same job fails with
# the rank's status. Two rendezvousd on loopback, the job dir written by hand, restart_on
# every class (31): an exit status is a user-error, which the default does not restart.
# timeout: 60
set -euo pipefail

# shellcheck source=prologue.sh
. "$(dirname "$0")/prologue.sh"
fail_show=('*.err' '*.out')
show_lines=30
need_built rendezvousd
rdv=$build/rendezvousd

# run_job MAX_RESTARTS: writes a job dir and runs both nodes; sets node0/node1 statuses.
run_job() {
    local dir=$work/job$1 fail_until=2
    [ "${2:-}" = exit5 ] && fail_until=99
    mkdir -m 0700 "$dir"
    head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$dir/key"
    echo >>"$dir/key"
    chmod 600 "$dir/key"
    cat >"$dir/job.json" <<JSON
{"version": 1, "job_id": "restart-$1", "nnodes": 2, "nprocs": 2, "loopback": true,
 "max_restarts": $1, "restart_on": 31, "kill_grace_ms": 500, "join_timeout_ms": 20000,
 "argv": ["sh", "-c", "echo gen \$GPURUN_RESTART_COUNT; if [ \$RANK = 3 ] && [ \$GPURUN_RESTART_COUNT -lt $fail_until ]; then exit 5; fi; sleep 0.2"]}
JSON
    "$rdv" --job-dir "$dir" --node-rank 0 >"$work/n0-$1.out" 2>"$work/n0-$1.err" &
    bg_pids=($!)
    "$rdv" --job-dir "$dir" --node-rank 1 >"$work/n1-$1.out" 2>"$work/n1-$1.err" &
    bg_pids+=($!)
    node0=0 node1=0
    start=$(date +%s%3N)
    wait "${bg_pids[0]}" || node0=$?
    wait "${bg_pids[1]}" || node1=$?
    bg_pids=()
    elapsed=$(($(date +%s%3N) - start))
    summary=$dir/summary.json
}

field() {
    /usr/bin/python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))" \
        "$summary" "$2"
}

run_job 2
[ "$node0/$node1" = 0/0 ] || fail "with 2 restarts: statuses $node0/$node1, want 0/0"
[ "$(field x "d['outcome']")" = completed ] || fail "outcome $(field x "d['outcome']")"
[ "$(field x "d['restarts']")" = 2 ] || fail "restarts $(field x "d['restarts']"), want 2"
[ "$(field x "len(d['earlier_failures'])")" = 2 ] || fail "earlier failures not 2"
field x "d['earlier_failures'][1]['cause']" | grep -q "rank 3 on node 1 .* exited with status 5" ||
    fail "earlier failure cause: $(field x "d['earlier_failures'][1]['cause']")"
# Ranks of a failing generation may be torn down before they print: only the failing rank's
# line is sure there; the last generation runs to the end on every rank.
for g in 0 1; do
    grep -q "^\[3\] gen $g$" "$work/n1-2.out" || fail "no line of rank 3 in generation $g"
done
n=$(cat "$work/n0-2.out" "$work/n1-2.out" | grep -c "^\[[0-9]\] gen 2$" || true)
[ "$n" = 4 ] || fail "generation 2: $n rank lines, want 4"
grep -q "restarting the job: generation 2" "$work/n0-2.err" || fail "no restart log line"
# Backoff: 1 s before the first restart, 2 s before the second.
grep -qF "restarting the job in 1.0 s (restart 1 of 2)" "$work/n0-2.err" || fail "no 1 s backoff"
grep -qF "restarting the job in 2.0 s (restart 2 of 2)" "$work/n0-2.err" || fail "no 2 s backoff"
[ "$elapsed" -ge 3000 ] || fail "two restarts took $elapsed ms, less than their 3 s of backoff"
# gpurun status of the completed job does not hide its restarts.
"$build/gpurun" status --job-dir "$work/job2" >"$work/status" 2>&1 || fail "status: $(cat "$work/status")"
grep -qx "restarts: 2" "$work/status" || fail "status lacks 'restarts: 2': $(head -n 6 "$work/status")"
for g in 0 1; do
    grep -qE "^  generation $g ended: rank 3 on node 1 .* exited with status 5$" "$work/status" ||
        fail "status lacks generation $g's end: $(grep generation "$work/status")"
done
# Every rank log marks where each restarted generation begins.
for r in 0 1 2 3; do
    log=$work/job2/logs/rank-$r.log
    [ "$(grep -cE '^----- gpurun: [0-9T:Z-]+: restart [12] of 2, the ranks start again -----$' "$log")" = 2 ] ||
        fail "rank $r's log lacks the two restart lines: $(cat "$log")"
done

run_job 1
[ "$node0/$node1" = 5/5 ] || fail "with 1 restart: statuses $node0/$node1, want 5/5"
[ "$(field x "d['outcome']")" = failed ] || fail "outcome $(field x "d['outcome']")"
[ "$(field x "d['restarts']")" = 1 ] || fail "restarts $(field x "d['restarts']"), want 1"
field x "d['first_failure']['cause']" | grep -q "rank 3" || fail "first failure does not name rank 3"
# SIGTERM during a restart's backoff ends the job: no new generation starts.
dir=$work/jobterm
mkdir -m 0700 "$dir"
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$dir/key"
echo >>"$dir/key"
chmod 600 "$dir/key"
cat >"$dir/job.json" <<JSON
{"version": 1, "job_id": "restart-term", "nnodes": 2, "nprocs": 1, "loopback": true,
 "max_restarts": 3, "restart_on": 31, "kill_grace_ms": 500, "join_timeout_ms": 20000,
 "argv": ["sh", "-c", "exit 5"]}
JSON
"$rdv" --job-dir "$dir" --node-rank 0 >"$work/t0.out" 2>"$work/t0.err" &
bg_pids=($!)
"$rdv" --job-dir "$dir" --node-rank 1 >"$work/t1.out" 2>"$work/t1.err" &
bg_pids+=($!)
for _ in $(seq 100); do
    grep -q "restarting the job in" "$work/t0.err" && break
    sleep 0.05
done
grep -q "restarting the job in 1.0 s" "$work/t0.err" || fail "no backoff before the first restart"
start=$(date +%s%3N)
kill -TERM "${bg_pids[0]}"
t0=0 t1=0
wait "${bg_pids[0]}" || t0=$?
wait "${bg_pids[1]}" || t1=$?
bg_pids=()
ms=$(($(date +%s%3N) - start))
[ "$ms" -lt 2000 ] || fail "SIGTERM during the backoff took $ms ms to end the job"
! grep -q "restarting the job: generation 1" "$work/t0.err" ||
    fail "a generation started after SIGTERM"
[ "$t0/$t1" = 143/143 ] || fail "statuses $t0/$t1 after SIGTERM, want 143/143"
summary=$dir/summary.json
[ "$(field x "d['outcome'], d['exit_status'], d['restarts'], len(d['earlier_failures'])")" = "('cancelled', 143, 0, 1)" ] ||
    fail "after SIGTERM in the backoff: $(field x "d['outcome'], d['exit_status'], d['restarts'], len(d['earlier_failures'])")"

# Three restarts (1 + 2 + 4 s of backoff, each longer than kill_grace plus the leader's
# slack for agents to report their ranks gone) all happen; then the job fails.
run_job 3 exit5
[ "$node0/$node1" = 5/5 ] || fail "with 3 restarts of a rank that always fails: statuses $node0/$node1"
[ "$(field x "d['outcome'], d['restarts'], len(d['earlier_failures'])")" = "('failed', 3, 3)" ] ||
    fail "3 restarts: $(field x "d['outcome'], d['restarts'], len(d['earlier_failures'])")"
grep -qF "restarting the job in 4.0 s (restart 3 of 3)" "$work/n0-3.err" || fail "no 4 s backoff"
! grep -q "did not report their ranks gone in time" "$work/n0-3.err" ||
    fail "the leader gave up on the agents during a backoff"
echo "restarts: generation 2 completed after two failures; one restart allowed: status 5"
