#!/usr/bin/env bash
# max_restarts: a rank that fails in generations 0 and 1 and succeeds in generation 2 gives a
# completed job with two earlier failures; with one restart allowed the same job fails with
# the rank's status. Two rendezvousd on loopback, the job dir written by hand.
# timeout: 60
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${BUILD:-build}
[[ $build == /* ]] || build=$root/$build
rdv=$build/rendezvousd
if [ ! -x "$rdv" ]; then
    echo "# SKIP '$rdv' is not built (make)"
    exit 77
fi
work=$(mktemp -d "${TEST_TMPDIR:-${TMPDIR:-/tmp}}/restart.XXXXXX")
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
}
trap cleanup EXIT

fail() {
    echo "FAIL: $*"
    for f in "$work"/*.err "$work"/*.out; do
        [ -s "$f" ] && { echo "# --- ${f##*/}"; tail -n 30 "$f" | sed 's/^/# /'; }
    done
    exit 1
}

# run_job MAX_RESTARTS: writes a job dir and runs both nodes; sets node0/node1 statuses.
run_job() {
    local dir=$work/job$1
    mkdir -m 0700 "$dir"
    head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$dir/key"
    echo >>"$dir/key"
    chmod 600 "$dir/key"
    cat >"$dir/job.json" <<JSON
{"version": 1, "job_id": "restart-$1", "nnodes": 2, "nprocs": 2, "loopback": true,
 "max_restarts": $1, "kill_grace_ms": 500, "join_timeout_ms": 20000,
 "argv": ["sh", "-c", "echo gen \$GPURUN_RESTART_COUNT; if [ \$RANK = 3 ] && [ \$GPURUN_RESTART_COUNT -lt 2 ]; then exit 5; fi; sleep 0.2"]}
JSON
    "$rdv" --job-dir "$dir" --node-rank 0 >"$work/n0-$1.out" 2>"$work/n0-$1.err" &
    pids=($!)
    "$rdv" --job-dir "$dir" --node-rank 1 >"$work/n1-$1.out" 2>"$work/n1-$1.err" &
    pids+=($!)
    node0=0 node1=0
    wait "${pids[0]}" || node0=$?
    wait "${pids[1]}" || node1=$?
    pids=()
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

run_job 1
[ "$node0/$node1" = 5/5 ] || fail "with 1 restart: statuses $node0/$node1, want 5/5"
[ "$(field x "d['outcome']")" = failed ] || fail "outcome $(field x "d['outcome']")"
[ "$(field x "d['restarts']")" = 1 ] || fail "restarts $(field x "d['restarts']"), want 1"
field x "d['first_failure']['cause']" | grep -q "rank 3" || fail "first failure does not name rank 3"
echo "restarts: generation 2 completed after two failures; one restart allowed: status 5"
