#!/usr/bin/env bash
# A flood of strangers' connections on the leader's port (loadgen flood: as fast as one core
# opens them, the newest 2,000 held open and silent, then a second wave that sends a
# well-formed hello and nothing more, then a third of one-frame hellos made without the key)
# while a 2-node job joins and runs: node 1 joins during
# the flood, heartbeats keep flowing (2 s timeout), the job completes with status 0, a new
# job (loadgen rendezvous, 64 agents) rendezvouses meanwhile, and the refusals are summarised
# rather than logged one by one. Two rendezvousd on loopback, the job dir written by hand.
# timeout: 60
set -euo pipefail

# shellcheck source=prologue.sh
. "$(dirname "$0")/prologue.sh"
fail_show=('*.err' '*.out')
show_lines=30
need_built --hint "make all" rendezvousd bench/loadgen
rdv=$build/rendezvousd
loadgen=$build/bench/loadgen

dir=$work/job
mkdir -m 0700 "$dir"
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$dir/key"
echo >>"$dir/key"
chmod 600 "$dir/key"
# Heartbeats every 200 ms and a node lost after 2 s without one: a loop starved by the flood
# fails the job well within it.
cat >"$dir/job.json" <<JSON
{"version": 1, "job_id": "flood", "nnodes": 2, "nprocs": 1, "loopback": true,
 "hb_interval_ms": 200, "hb_timeout_ms": 2000, "kill_grace_ms": 500, "join_timeout_ms": 20000,
 "argv": ["sh", "-c", "sleep 7; echo done \$RANK"]}
JSON
"$rdv" --job-dir "$dir" --node-rank 0 --log-level info >"$work/n0.out" 2>"$work/n0.err" &
bg_pids=($!)
for _ in $(seq 100); do
    [ -s "$dir/endpoint.json" ] && break
    sleep 0.1
done
port=$(/usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["port"])' \
    "$dir/endpoint.json") || fail "no endpoint.json from node 0"

# Wave 1, silent connections, then wave 2, hellos, then wave 3, one-frame hellos without the
# key (each costs the leader an HMAC): the job runs under one or another from node 1's join
# (1 s in) to its end (8 s in).
( "$loadgen" flood --port "$port" --seconds 3 --hold 2000 &&
    "$loadgen" flood --port "$port" --seconds 3 --hold 2000 --hello &&
    "$loadgen" flood --port "$port" --seconds 3 --hold 2000 --early ) >"$work/flood.out" \
    2>"$work/flood.err" &
flood=$!
bg_pids+=("$flood")
sleep 1
"$rdv" --job-dir "$dir" --node-rank 1 --rendezvous "127.0.0.1:$port" >"$work/n1.out" \
    2>"$work/n1.err" &
bg_pids+=($!)
# A new job (another leader, 64 agents of 8 ranks) rendezvouses while the flood goes on.
sleep 2
newjob=0
TMPDIR=$work "$loadgen" rendezvous --agents 64 --reps 1 --rendezvousd "$rdv" >"$work/newjob.out" \
    2>"$work/newjob.err" || newjob=$?
node0=0 node1=0
wait "${bg_pids[0]}" || node0=$?
wait "${bg_pids[2]}" || node1=$?
wait "$flood" || fail "the flood failed: $(cat "$work/flood.err")"
bg_pids=()

attempts=$(awk '{ n += $1 } END { print n + 0 }' "$work/flood.out")
echo "# flood: $(tr '\n' ';' <"$work/flood.out")"
[ "$attempts" -ge 20000 ] || fail "the flood made $attempts attempts, want 20000 at least"
[ "$node0/$node1" = 0/0 ] || fail "under the flood: statuses $node0/$node1, want 0/0"
[ "$newjob" = 0 ] || fail "a new job's rendezvous during the flood exited $newjob, want 0"
outcome=$(/usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["outcome"])' \
    "$dir/summary.json") || fail "no summary.json"
[ "$outcome" = completed ] || fail "outcome '$outcome', want completed"
grep -q "^\[1\] done 1$" "$work/n1.out" || fail "rank 1 on node 1 did not run to its end"
grep -q "all 2 nodes joined" "$work/n0.err" || fail "no join line from the leader"
# Strangers were refused and summarised: the log stays far below one line per attempt.
grep -q "refused [0-9,]* connections from '127.0.0.1'" "$work/n0.err" ||
    fail "no refusal summary in the leader's log"
grep -q "refused [0-9,]* connections from '127.0.0.1'.*wrong job key" "$work/n0.err" ||
    fail "no refusal of the one-frame hellos made without the key in the leader's log"
lines=$(wc -l <"$work/n0.err")
[ "$lines" -lt 200 ] || fail "the leader wrote $lines log lines under the flood"
echo "flood of $attempts connections: node 1 joined, the job completed, $lines log lines"
