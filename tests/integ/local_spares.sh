#!/usr/bin/env bash
# Hot spares (--spare-nodes): a 2-node job with one spare (and no --max-restarts: a spare
# implies a restart, which gpurun says) whose node 1 daemon is SIGKILLed
# mid-run completes, the spare serving node 1's ranks in the next generation (same world
# size, same rank numbers, NODE_RANK 1), the swap in gpurun status and summary.json; a lost
# spare leaves the job running; a straggler's node (--straggler-action replace) and the node
# of a rank a hang is traced to give their places at the restart; with no spare left a lost
# node still ends the job (125). Under --max-restarts 0 the spare stays idle and gpurun says
# why at the start, in the leader's end line, summary.json and status.
# timeout: 120
set -euo pipefail
# shellcheck source=local_common.sh
. "$(dirname "$0")/local_common.sh"

py=/usr/bin/python3
[ -x "$py" ] || py=python3

# The ranks: generation 0 runs until killed (each prints its line first), generation 1 writes
# where it ran and ends.
cat >"$work/rank.sh" <<'EOF'
echo "gen $GPURUN_RESTART_COUNT rank $RANK of $WORLD_SIZE node_rank $NODE_RANK"
if [ "$GPURUN_RESTART_COUNT" = 0 ]; then exec sleep 60; fi
echo "$RANK $WORLD_SIZE $NODE_RANK $GPURUN_RESTART_COUNT" >"$OUT_DIR/ran.$RANK"
EOF

# start_job DIR ARGS...: gpurun --local ARGS in the background on the ranks above; sets gp.
start_job() {
    local dir=$1
    shift
    mkdir -p "$work/outdir-${dir##*/}"
    OUT_DIR=$work/outdir-${dir##*/} timeout -k 5 90 "$gpurun" --local --gpus-per-node 1 \
        --job-dir "$dir" --kill-grace 1 "$@" -- sh "$work/rank.sh" \
        >"$work/out-${dir##*/}" 2>"$work/err-${dir##*/}" </dev/null &
    gp=$!
    bg_pids+=("$gp")
}

# wait_lines FILE N: until FILE has N lines starting "[" (ranks' output), 20 s at most.
wait_rank_lines() {
    local i
    for ((i = 0; i < 400; i++)); do
        [ "$(grep -c '^\[' "$1" 2>/dev/null || true)" -ge "$2" ] && return 0
        sleep 0.05
    done
    fail "'$1' did not get $2 rank lines: $(tail -n 5 "$1" 2>/dev/null)"
}

field() {
    "$py" -c 'import json, sys; d = json.load(open(sys.argv[1])); print(eval(sys.argv[2]))' \
        "$1/summary.json" "$2"
}

# --- node 1 lost: the spare takes its place, with no restart option given -----------------
# A spare serves at a restart: --spare-nodes 1 alone implies one, and gpurun says so.
job=$work/swap
start_job "$job" -N 2 --spare-nodes 1
wait_rank_lines "$work/out-swap" 2
pid=$(daemon_pid "$job" 1)
[ -n "$pid" ] || fail "no rendezvousd of node 1 of $job"
"$gpurun" status --job-dir "$job" >"$work/st0" 2>&1 || true
grep -qx "spares: 1 (1 idle)" "$work/st0" || fail "status before the loss: $(cat "$work/st0")"
kill -KILL "$pid"
rc=0
wait "$gp" || rc=$?
[ "$rc" = 0 ] || fail "the job with a spare exited $rc: $(tail -n 8 "$work/err-swap")"
od=$work/outdir-swap
for r in 0 1; do
    [ -f "$od/ran.$r" ] || fail "rank $r did not run in generation 1"
done
[ "$(cat "$od/ran.1")" = "1 2 1 1" ] ||
    fail "rank 1 of generation 1: '$(cat "$od/ran.1")', want rank 1 of 2 on the job's node 1"
[ "$(field "$job" "d['outcome']")" = completed ] || fail "outcome $(field "$job" "d['outcome']")"
[ "$(field "$job" "[(s['node'], s['spare'], s['generation']) for s in d['swaps']]")" = "[(1, 2, 1)]" ] ||
    fail "swaps: $(field "$job" "d['swaps']")"
field "$job" "d['swaps'][0]['cause']" | grep -q "node 1 .* lost" ||
    fail "the swap's cause: $(field "$job" "d['swaps'][0]['cause']")"
[ "$(field "$job" "[n['state'] for n in d['nodes']]")" = "['done', 'fenced', 'done']" ] ||
    fail "node states: $(field "$job" "[n['state'] for n in d['nodes']]")"
[ "$(field "$job" "d['earlier_failures'][0]['class']")" = node ] ||
    fail "the lost node's class: $(field "$job" "d['earlier_failures'][0]")"
"$gpurun" status --job-dir "$job" >"$work/st1" 2>&1 || fail "status: $(cat "$work/st1")"
grep -qE "^  node 1 \(.*\) fenced: node 1 .* lost: .*; spare node 2 \(.*\) took its place \(generation 1\)$" \
    "$work/st1" || fail "status lacks the swap: $(cat "$work/st1")"
grep -q "node 1 ('.*') fenced: .*; spare node 2 ('.*') took its place" "$work/err-swap" ||
    fail "no log line of the swap: $(grep -i spare "$work/err-swap")"
grep -qxF "gpurun: --spare-nodes 1: up to 1 restart after a node or hang failure, for a spare to take the failed node's place (--max-restarts sets another number)" \
    "$work/err-swap" || fail "gpurun did not say what the spare implies: $(grep -v '^\[' "$work/err-swap" | head -n 3)"
[ "$(field "$job" "(d['restarts'], d['first_failure'] is None)")" = "(1, True)" ] ||
    fail "restarts, first failure: $(field "$job" "(d['restarts'], d['first_failure'])")"
echo "# node 1 lost: spare node 2 took its place, the job completed (no --max-restarts given)"

# --- --max-restarts 0: the spare stays idle, and gpurun says so at the start and the end ----
cat >"$work/rank.sh" <<'EOF'
echo "up $RANK"
exec sleep 60
EOF
job=$work/idle
start_job "$job" -N 2 --spare-nodes 1 --max-restarts 0
wait_rank_lines "$work/out-idle" 2
pid=$(daemon_pid "$job" 1)
[ -n "$pid" ] || fail "no rendezvousd of node 1 of $job"
kill -KILL "$pid"
rc=0
wait "$gp" || rc=$?
[ "$rc" = 125 ] || fail "a lost node under --max-restarts 0: exit $rc, want 125"
grep -qxF "gpurun: --spare-nodes 1 with --max-restarts 0: the spare will stay idle (a spare takes a failed node's place at a restart)" \
    "$work/err-idle" || fail "no word at the start that the spare will stay idle: $(grep -v '^\[' "$work/err-idle" | head -n 3)"
grep -q "warn: job .*: failed, exit status 125; spare stayed idle: --max-restarts 0: a spare serves only at a restart$" \
    "$work/err-idle" || fail "the end line does not say why the spare stayed idle: $(grep -v '^\[' "$work/err-idle")"
[ "$(field "$job" "d['spares_idle_why']")" = "--max-restarts 0: a spare serves only at a restart" ] ||
    fail "summary.json's spares_idle_why: $(field "$job" "d.get('spares_idle_why')")"
"$gpurun" status --job-dir "$job" >"$work/st-idle" 2>&1 || true
grep -qxF "spares: 1 (1 idle: --max-restarts 0: a spare serves only at a restart)" "$work/st-idle" ||
    fail "status: $(grep spares "$work/st-idle")"
echo "# --max-restarts 0: the spare stayed idle, said at the start, at the end and by status"

# --- two nodes lost at once with one spare: one story naming both, and why the spare idled --
job=$work/two-lost
start_job "$job" -N 3 --spare-nodes 1
wait_rank_lines "$work/out-two-lost" 3
p1=$(daemon_pid "$job" 1)
p2=$(daemon_pid "$job" 2)
if [ -z "$p1" ] || [ -z "$p2" ]; then fail "no rendezvousd of node 1 or 2 of $job"; fi
kill -KILL "$p1" "$p2"
rc=0
wait "$gp" || rc=$?
[ "$rc" = 125 ] || fail "two nodes lost with one spare: exit $rc, want 125"
cause=$(field "$job" "d['first_failure']['cause']")
[[ $cause == *"node 1 ('"* && $cause == *"node 2 ('"* && $cause == *" lost too: "* ]] ||
    fail "the record does not name both lost nodes: '$cause'"
[ "$(field "$job" "len(d['first_failure']['also_lost'])")" = 1 ] ||
    fail "also_lost: $(field "$job" "d['first_failure'].get('also_lost')")"
grep -q "warn: node [12] ('.*') lost too: .*; no restart: too few spares for every node lost$" \
    "$work/err-two-lost" || fail "no line that the second loss calls the restart off: $(grep -v '^\[' "$work/err-two-lost")"
grep -q "error: job failed: node [12] .* lost: .*; node [12] .* lost too: " "$work/err-two-lost" ||
    fail "'job failed' does not name both nodes: $(grep 'job failed' "$work/err-two-lost")"
[ "$(field "$job" "d['spares_idle_why']")" = "2 nodes lost and 1 spare: too few to take every place" ] ||
    fail "spares_idle_why: $(field "$job" "d.get('spares_idle_why')")"
echo "# two nodes lost, one spare: one record naming both, the spare's idleness explained"

# --- two nodes lost at once with two spares: both replaced ----------------------------------
cat >"$work/rank.sh" <<'EOF'
echo "gen $GPURUN_RESTART_COUNT rank $RANK"
if [ "$GPURUN_RESTART_COUNT" = 0 ]; then exec sleep 60; fi
EOF
job=$work/two-spares
start_job "$job" -N 3 --spare-nodes 2
wait_rank_lines "$work/out-two-spares" 3
p1=$(daemon_pid "$job" 1)
p2=$(daemon_pid "$job" 2)
if [ -z "$p1" ] || [ -z "$p2" ]; then fail "no rendezvousd of node 1 or 2 of $job"; fi
kill -KILL "$p1" "$p2"
rc=0
wait "$gp" || rc=$?
[ "$rc" = 0 ] || fail "two nodes lost with two spares: exit $rc: $(grep -v '^\[' "$work/err-two-spares")"
[ "$(field "$job" "sorted(s['node'] for s in d['swaps'])")" = "[1, 2]" ] ||
    fail "swaps: $(field "$job" "d['swaps']")"
echo "# two nodes lost, two spares: both took a place"

# --- a spare lost: the job runs on ---------------------------------------------------------
cat >"$work/rank.sh" <<'EOF'
echo "up $RANK"
sleep 3
EOF
job=$work/spare-lost
start_job "$job" -N 2 --spare-nodes 1 --max-restarts 1
wait_rank_lines "$work/out-spare-lost" 2
pid=$(daemon_pid "$job" 2)
[ -n "$pid" ] || fail "no rendezvousd of the spare of $job"
kill -KILL "$pid"
rc=0
wait "$gp" || rc=$?
[ "$rc" = 0 ] || fail "a job whose spare was lost exited $rc: $(tail -n 5 "$work/err-spare-lost")"
grep -q "spare node 2 ('.*') lost" "$work/err-spare-lost" || fail "no line for the lost spare"
[ "$(field "$job" "d['restarts']")" = 0 ] || fail "restarts after a lost spare"
echo "# a lost spare: the job ran on"

# --- --straggler-action=replace: the straggler's node gives its place at the restart ------
cat >"$work/slow.py" <<EOF
import os, sys, time
sys.path.insert(0, "$root/lib/rank/python")
import gpurun
gen = int(os.environ["GPURUN_RESTART_COUNT"])
if gen == 1:
    open(os.path.join(os.environ["OUT_DIR"], "gen1.%d" % gpurun.rank()), "w").write(
        os.environ["NODE_RANK"])
    sys.exit(0)
for step in range(1, 101):
    time.sleep(0.08 if gpurun.rank() == 1 else 0.03)
    gpurun.report(step)
if gpurun.rank() == 0:
    sys.exit(3)
time.sleep(30)
EOF
job=$work/replace
mkdir -p "$work/outdir-replace"
rc=0
OUT_DIR=$work/outdir-replace timeout -k 5 90 "$gpurun" --local -N 2 --gpus-per-node 1 \
    --spare-nodes 1 --max-restarts 1 --restart-on all --straggler-action replace --kill-grace 1 \
    --job-dir "$job" -- "$py" "$work/slow.py" >"$work/out-replace" 2>"$work/err-replace" \
    </dev/null || rc=$?
[ "$rc" = 0 ] || fail "the job that replaced its straggler exited $rc: $(tail -n 5 "$work/err-replace")"
[ "$(field "$job" "[(s['node'], s['spare'], s['generation']) for s in d['swaps']]")" = "[(1, 2, 1)]" ] ||
    fail "swaps: $(field "$job" "d.get('swaps')")"
field "$job" "d['swaps'][0]['cause']" | grep -q "^a straggler: rank 1 [0-9]*% slower than the median$" ||
    fail "the swap's cause: $(field "$job" "d['swaps'][0]['cause']")"
[ "$(cat "$work/outdir-replace/gen1.1" 2>/dev/null)" = 1 ] ||
    fail "rank 1 did not run as the job's node 1 in generation 1"
echo "# --straggler-action=replace: the straggler's node gave its place at the restart"

# --- a hang traced to node 1: its node gives its place at the restart ----------------------
cat >"$work/hang.py" <<EOF
import os, sys, time
sys.path.insert(0, "$root/lib/rank/python")
import gpurun
gen = int(os.environ["GPURUN_RESTART_COUNT"])
if gen == 1:
    open(os.path.join(os.environ["OUT_DIR"], "gen1.%d" % gpurun.rank()), "w").write(
        os.environ["NODE_RANK"])
    sys.exit(0)
for step in range(1, 1000):
    gpurun.report(step)
    # Rank 1 stops reporting after step 5: stuck, as a rank on a sick GPU is.
    time.sleep(60 if gpurun.rank() == 1 and step == 5 else 0.05)
EOF
job=$work/hang
mkdir -p "$work/outdir-hang"
rc=0
OUT_DIR=$work/outdir-hang timeout -k 5 90 "$gpurun" --local -N 2 --gpus-per-node 1 \
    --spare-nodes 1 --max-restarts 1 --hang-timeout 2 --kill-grace 1 \
    --job-dir "$job" -- "$py" "$work/hang.py" >"$work/out-hang" 2>"$work/err-hang" \
    </dev/null || rc=$?
[ "$rc" = 0 ] || fail "the job whose rank 1 hung exited $rc: $(tail -n 5 "$work/err-hang")"
[ "$(field "$job" "[(s['node'], s['spare'], s['generation']) for s in d['swaps']]")" = "[(1, 2, 1)]" ] ||
    fail "swaps: $(field "$job" "d.get('swaps')")"
field "$job" "d['swaps'][0]['cause']" | grep -q "^rank 1 on node 1 .* hung" ||
    fail "the swap's cause: $(field "$job" "d['swaps'][0]['cause']")"
[ "$(field "$job" "d['earlier_failures'][0]['class']")" = hang ] ||
    fail "the hang's class: $(field "$job" "d['earlier_failures'][0]")"
[ "$(cat "$work/outdir-hang/gen1.1")" = 1 ] || fail "rank 1 of generation 1 did not run with NODE_RANK 1"
echo "# a hang traced to node 1: the spare took its place"

# --- no spare left: a lost node ends the job ------------------------------------------------
cat >"$work/rank.sh" <<'EOF'
echo "up $RANK"
exec sleep 60
EOF
job=$work/none-left
start_job "$job" -N 3 --max-restarts 2
wait_rank_lines "$work/out-none-left" 3
pid=$(daemon_pid "$job" 2)
[ -n "$pid" ] || fail "no rendezvousd of node 2 of $job"
kill -KILL "$pid"
rc=0
wait "$gp" || rc=$?
[ "$rc" = 125 ] || fail "a lost node without spares: exit $rc, want 125"
[ "$(field "$job" "d['restarts']")" = 0 ] || fail "restarted without a spare"
echo "# without a spare, a lost node ends the job"

# --- a rank's own error with spares alone: not a failure a spare fixes, and said so --------
cat >"$work/rank.sh" <<'EOF2'
[ "$RANK" = 1 ] && exit 3
exec sleep 60
EOF2
job=$work/user-error
start_job "$job" -N 2 --spare-nodes 1 --log-level info
rc=0
wait "$gp" || rc=$?
[ "$rc" = 3 ] || fail "a rank's exit 3 with a spare: exit $rc, want 3"
[ "$(field "$job" "d['restarts']")" = 0 ] || fail "a user error was restarted for a spare"
grep -q "warn: not restarting: a user-error failure, which the spares' restarts (node and hang failures) do not cover" \
    "$work/err-user-error" || fail "no word why the user error is not restarted: $(grep -v '^\[' "$work/err-user-error")"
echo "# a user error with a spare: not restarted, and said why"
