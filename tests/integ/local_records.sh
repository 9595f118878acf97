#!/usr/bin/env bash
# One truth: for each way a local job can end badly, gpurun's exit status, summary.json and
# 'gpurun status --job-dir' agree, and there is always a summary.json (gpurun writes it when
# the leader was killed), its failure with a class. Each row: a name, what is done to the
# running job, the exit status, and the state status shows (summary.json's outcome follows
# from the state).
# timeout: 120
set -euo pipefail
# shellcheck source=local_common.sh
. "$(dirname "$0")/local_common.sh"

# act ACTION DIR PID: does ACTION to the job in DIR, whose gpurun runs under timeout PID.
act() {
    case $1 in
    limit) ;;
    kill-node0) sleep 1 && kill -KILL "$(daemon_pid "$2" 0)" ;;
    kill-node1) sleep 1 && kill -KILL "$(daemon_pid "$2" 1)" ;;
    kill-gpurun) sleep 1 && kill -KILL "$(pgrep -P "$3" -x gpurun)" ;;
    cancel) sleep 1 && "$gpurun" cancel --job-dir "$2" 2>/dev/null ;;
    esac
}

# name action time-limit expected-exit expected-state expected-outcome
table=(
    "limit limit 0:02 124 TIMEOUT timeout"
    "kill-node0 kill-node0 - 125 FAILED failed"
    "kill-node1 kill-node1 - 125 FAILED failed"
    "kill-gpurun kill-gpurun 0:30 - CANCELLED cancelled"
    "cancel cancel - 143 CANCELLED cancelled"
)

# The ranks' command, this run's own: another job on the machine must not count as ours.
nap=30.$$
for row in "${table[@]}"; do
    read -r name action limit want_rc want_state want_outcome <<<"$row"
    dir=$work/$name
    targs=()
    [ "$limit" = - ] || targs=(-t "$limit")
    start=$(date +%s)
    rc=0
    timeout -k 5 "$GPURUN_LIMIT" "$gpurun" --local --nodes 2 --job-dir "$dir" "${targs[@]}" \
        -- sleep "$nap" >"$work/out" 2>"$work/err" </dev/null &
    gpid=$!
    bg_pids+=("$gpid")
    act "$action" "$dir" "$gpid"
    wait "$gpid" || rc=$?
    # A killed gpurun says nothing: its daemons must still end the job, and soon.
    if [ "$want_rc" = - ]; then
        for ((i = 0; i < 100; i++)); do
            [ -z "$(daemon_pid "$dir" 0)$(daemon_pid "$dir" 1)" ] && break
            sleep 0.1
        done
    else
        [ "$rc" = "$want_rc" ] || fail "$name: exit status $rc, expected $want_rc"
    fi
    elapsed=$(($(date +%s) - start))
    [ "$elapsed" -le 15 ] || fail "$name: took $elapsed s, expected a few"
    [ -z "$(daemon_pid "$dir" 0)$(daemon_pid "$dir" 1)" ] || fail "$name: daemons still running"
    ! pgrep -f "exec-rank .* -- sleep $nap\$" -a | grep -q . ||
        fail "$name: ranks still running: $(pgrep -af "sleep $nap")"
    st=0
    "$gpurun" status --job-dir "$dir" >"$work/status" 2>&1 || st=$?
    [ "$st" = 0 ] || fail "$name: status exit $st, expected 0: $(cat "$work/status")"
    grep -q "^state: $want_state\\b" "$work/status" ||
        fail "$name: status says '$(grep '^state' "$work/status" || head -1 "$work/status")', expected state $want_state"
    if [ "$want_outcome" = - ]; then
        [ ! -e "$dir/summary.json" ] || fail "$name: a summary.json, expected none"
        continue
    fi
    [ -f "$dir/summary.json" ] || fail "$name: no summary.json"
    got=$(/usr/bin/python3 -c 'import json,sys; j=json.load(open(sys.argv[1]))
print(j["outcome"], j["exit_status"], sum(r["phase"] == "running" for r in j.get("ranks", [])))' "$dir/summary.json")
    read -r outcome status running <<<"$got"
    [ "$outcome" = "$want_outcome" ] || fail "$name: summary outcome '$outcome', expected '$want_outcome'"
    [ "$want_rc" = - ] || [ "$status" = "$want_rc" ] ||
        fail "$name: summary exit_status $status, expected $want_rc (gpurun's)"
    [ "$running" = 0 ] || fail "$name: $running ranks still 'running' in the summary"
    # Every failure has a class, gpurun's records (a killed leader) included.
    if [ "$want_outcome" = failed ]; then
        cls=$(/usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["first_failure"].get("class"))' "$dir/summary.json")
        [ "$cls" = node ] || fail "$name: the first failure's class is '$cls', expected node"
    fi
    grep -q "exit status $status" "$work/status" || fail "$name: status lacks 'exit status $status'"
    # The leader killed: gpurun, which saw it die, writes the record and says so.
    if [ "$name" = kill-node0 ]; then
        grep -qF "node 0's rendezvousd (the leader) was killed by signal 9 (SIGKILL)" "$work/err" ||
            fail "$name: gpurun does not say how the leader ended: $(cat "$work/err")"
        cause=$(/usr/bin/python3 -c 'import json,sys; j=json.load(open(sys.argv[1]))
print(j["recorded_by"], j["first_failure"]["node"], j["first_failure"]["signal"])' "$dir/summary.json")
        [ "$cause" = "gpurun 0 9" ] || fail "$name: summary recorded_by, first_failure node, signal: $cause"
    fi
    echo "ok - $name: exit ${rc}, $want_state, summary $outcome $status"
done

# Three nodes, node 2's daemon killed: the leader records the lost node and fails the job with
# 125; node 1 then exits with that same 125, which gpurun must not take for a daemon that
# failed to start: the leader's record stands, and gpurun says nothing of node 1.
dir=$work/kill-node2-of-3
timeout -k 5 "$GPURUN_LIMIT" "$gpurun" --local --nodes 3 --job-dir "$dir" -- sleep "$nap" \
    >"$work/out" 2>"$work/err" </dev/null &
gpid=$!
bg_pids+=("$gpid")
sleep 1 && kill -KILL "$(daemon_pid "$dir" 2)"
rc=0
wait "$gpid" || rc=$?
[ "$rc" = 125 ] || fail "node 2 of 3 killed: exit status $rc, expected 125"
cause=$(/usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["first_failure"]["cause"])' "$dir/summary.json")
[[ $cause == "node 2 ('"*"') lost: "* ]] || fail "node 2 of 3 killed: the record's cause is '$cause'"
! grep -q "node 1's rendezvousd" "$work/err" || fail "gpurun blamed node 1: $(grep "node 1's" "$work/err")"
echo "ok - kill-node2-of-3: exit 125, the leader's record: $cause"
