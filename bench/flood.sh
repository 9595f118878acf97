#!/usr/bin/env bash
# make bench, section 8: the leader under a flood of strangers' connections (bench/README.md).
# A running 2-node job (heartbeats every 200 ms, a node lost after 2 s without one) while
# bench/loadgen floods its leader's port in three phases of SECONDS/3 each: silent
# connections, well-formed hellos that never prove the key, and headers announcing a 1 MiB
# frame followed by as much of it as the socket takes (the pre-authentication memory attack).
# In each phase a new job of AGENTS agents (its own leader) rendezvouses, timed against the
# same rendezvous on the quiet machine; node 1 joins the flooded leader in the first phase.
# Prints markdown rows; exits 1 when the job did not survive.
#
# usage: bench/flood.sh LOADGEN RENDEZVOUSD SECONDS AGENTS
set -euo pipefail

loadgen=$1 rdv=$2 seconds=$3 agents=$4
phase_s=$((seconds / 3))
[ "$phase_s" -ge 2 ] || { echo "bench/flood.sh: SECONDS must be 6 at least" >&2; exit 2; }
work=$(mktemp -d "${TMPDIR:-/tmp}/gr-flood.XXXXXX")
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    rm -rf "$work"
}
trap cleanup EXIT
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

ms() { date +%s%3N; }
# The barrier-released column (the 7th) of loadgen rendezvous's row for this size.
rdv_barrier_ms() {
    TMPDIR=$work "$loadgen" rendezvous --agents "$agents" --reps 1 --rendezvousd "$rdv" \
        2>>"$work/newjob.err" | awk -F'|' -v r=$((agents * 8)) '$2 + 0 == r { gsub(/[* ]/, "", $8); print $8 }'
}
# The leader's peak resident memory so far (VmHWM), in MiB.
peak_mib() { awk '/^VmHWM:/ { printf "%.1f", $2 / 1024 }' "/proc/$1/status" 2>/dev/null; }

dir=$work/job
mkdir -m 0700 "$dir"
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$dir/key"
echo >>"$dir/key"
chmod 600 "$dir/key"
run_s=$((seconds + 8))
cat >"$dir/job.json" <<JSON
{"version": 1, "job_id": "flood-bench", "nnodes": 2, "nprocs": 1, "loopback": true,
 "hb_interval_ms": 200, "hb_timeout_ms": 2000, "kill_grace_ms": 500, "join_timeout_ms": 30000,
 "argv": ["sh", "-c", "sleep $run_s; echo done \$RANK"]}
JSON

quiet_ms=$(rdv_barrier_ms)
"$rdv" --job-dir "$dir" --node-rank 0 --log-level info >"$work/n0.out" 2>"$work/n0.err" &
leader=$!
pids=("$leader")
for _ in $(seq 100); do
    [ -s "$dir/endpoint.json" ] && break
    sleep 0.1
done
port=$(sed -n 's/.*"port": *\([0-9]*\).*/\1/p' "$dir/endpoint.json")
[ -n "$port" ] || { echo "bench/flood.sh: no endpoint.json from node 0" >&2; exit 1; }
rss0=$(peak_mib "$leader")

echo "| phase | flood attempts/s | node 1 join ms | new job: $agents agents, barrier ms (quiet: $quiet_ms) | leader peak RSS MiB (at start: $rss0) |"
echo "|---|---:|---:|---:|---:|"
join_ms=- node1_pid=
for phase in silent hello "frame 1 MiB"; do
    case $phase in
    silent) args=() ;;
    hello) args=(--hello) ;;
    *) args=(--frame 1048576) ;;
    esac
    "$loadgen" flood --port "$port" --seconds "$phase_s" --hold 2000 "${args[@]}" \
        >"$work/flood.out" 2>"$work/flood.err" &
    flood=$!
    pids+=("$flood")
    if [ "$phase" = silent ]; then
        sleep 1
        t1=$(ms)
        "$rdv" --job-dir "$dir" --node-rank 1 --rendezvous "127.0.0.1:$port" >"$work/n1.out" \
            2>"$work/n1.err" &
        node1_pid=$!
        pids+=("$node1_pid")
        for _ in $(seq 1000); do
            grep -q "all 2 nodes joined" "$work/n0.err" && break
            sleep 0.01
        done
        grep -q "all 2 nodes joined" "$work/n0.err" && join_ms=$(($(ms) - t1))
    fi
    newjob=$(rdv_barrier_ms) || true
    wait "$flood" || { echo "bench/flood.sh: the flood failed: $(cat "$work/flood.err")" >&2; exit 1; }
    attempts=$(awk '{ print $1 }' "$work/flood.out")
    printf '| %s | %d | %s | %s | %s |\n' "$phase" $((attempts / phase_s)) \
        "$([ "$phase" = silent ] && echo "$join_ms" || echo)" "${newjob:-failed}" "$(peak_mib "$leader")"
done
node0=0 node1=0
wait "${pids[0]}" || node0=$?
wait "$node1_pid" || node1=$?
pids=()
outcome=$(sed -n 's/.*"outcome": *"\([a-z]*\)".*/\1/p' "$dir/summary.json" 2>/dev/null | head -n 1)
lines=$(wc -l <"$work/n0.err")
echo
echo "The flooded job: exit statuses $node0/$node1 (node 0/node 1), outcome '${outcome:-none}', ${lines} lines in the leader's log."
[ "$node0/$node1" = 0/0 ] && [ "$outcome" = completed ]
