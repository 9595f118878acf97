#!/usr/bin/env bash
# The time limit lives in the leader, not only in gpurun: two rendezvousd started by hand (no
# gpurun, no launcher pid) with job.json's time_limit_s = 2 end their job of 'sleep 30' ranks
# at the limit on their own: both exit 124, summary.json says timeout with exit status 124,
# and no rank is left.
# timeout: 30
set -euo pipefail

# shellcheck source=prologue.sh
. "$(dirname "$0")/prologue.sh"
fail_show=('*.err')
need_built --hint "make all" rendezvousd
rdv=$build/rendezvousd

dir=$work/job
mkdir -m 0700 "$dir"
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$dir/key"
echo >>"$dir/key"
chmod 600 "$dir/key"
marker="sleep 30.$$"
cat >"$dir/job.json" <<JSON
{"version": 1, "job_id": "limit", "nnodes": 2, "nprocs": 1, "loopback": true,
 "time_limit_s": 2, "kill_grace_ms": 500, "argv": ["sh", "-c", "exec $marker"]}
JSON
start=$(date +%s%3N)
"$rdv" --job-dir "$dir" --node-rank 0 >"$work/n0.out" 2>"$work/n0.err" &
bg_pids=($!)
for _ in $(seq 100); do
    [ -s "$dir/endpoint.json" ] && break
    sleep 0.1
done
port=$(sed -n 's/.*"port": *\([0-9]*\).*/\1/p' "$dir/endpoint.json")
[ -n "$port" ] || fail "no endpoint.json from node 0"
"$rdv" --job-dir "$dir" --node-rank 1 --rendezvous "127.0.0.1:$port" >"$work/n1.out" \
    2>"$work/n1.err" &
bg_pids+=($!)
node0=0 node1=0
wait "${bg_pids[0]}" || node0=$?
wait "${bg_pids[1]}" || node1=$?
bg_pids=()
elapsed=$(($(date +%s%3N) - start))
[ "$node0/$node1" = 124/124 ] || fail "exit statuses $node0/$node1, want 124/124"
if [ "$elapsed" -lt 1800 ] || [ "$elapsed" -gt 6000 ]; then fail "ended after $elapsed ms, want about 2 s"; fi
got=$(/usr/bin/python3 -c 'import json,sys; j=json.load(open(sys.argv[1]))
print(j["outcome"], j["exit_status"], sum(r["phase"] == "running" for r in j["ranks"]))' "$dir/summary.json") ||
    fail "no summary.json"
[ "$got" = "timeout 124 0" ] || fail "summary (outcome, exit status, ranks running): $got"
! pgrep -f "^$marker\$" >/dev/null || fail "ranks left: $(pgrep -af "$marker")"
echo "the leader alone ended the job at its 2 s limit after $elapsed ms: 124/124, summary timeout"
