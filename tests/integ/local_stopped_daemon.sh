#!/usr/bin/env bash
# A stopped daemon (SIGSTOP) of node 1: the leader loses it after the heartbeat timeout and
# fails the job; gpurun --local then returns within a second of that verdict (a stopped
# daemon never handles the SIGTERM of its grace: gpurun continues it and tells it to end,
# killing it half a second later if it has not, its shims ending its
# ranks), exits 125 with the record naming node 1 (class node), and node 1's ranks do not
# run on: none writes after gpurun has returned, and no process of the job is left.
# timeout: 60
set -euo pipefail
# shellcheck source=local_common.sh
. "$(dirname "$0")/local_common.sh"

job=$work/job
mark=stopped-daemon-$$
# shellcheck disable=SC2016 # expanded by the ranks' shell
timeout -k 5 40 "$gpurun" --local -N 2 --heartbeat 0.2 --heartbeat-timeout 2 --job-dir "$job" \
    -- sh -c 'while :; do date +%s%3N >"$1.$RANK.t" && mv "$1.$RANK.t" "$1.$RANK"; sleep 0.05; done' \
    "$mark" "$work/alive" \
    >"$work/out" 2>"$work/err" </dev/null &
gp=$!
bg_pids+=("$gp")
for ((i = 0; i < 200; i++)); do
    [ -s "$work/alive.1" ] && break
    sleep 0.05
done
[ -s "$work/alive.1" ] || fail "rank 1 did not start: $(tail -n 5 "$work/err")"
victim=$(pgrep -f -- "rendezvousd --job-dir $job --node-rank 1( |$)" || true)
[ -n "$victim" ] || fail "no rendezvousd of node 1"
cont() {
    kill -CONT "${victim:-}" 2>/dev/null || true
}
exit_hooks+=(cont)
kill -STOP "$victim"
rc=0
wait "$gp" || rc=$?
end=$(date +%s%3N)
[ "$rc" = 125 ] || fail "exit status $rc, expected 125: $(grep -v '^\[' "$work/err")"
line=$(grep -m1 "error: job failed: node 1 ('[^']*') lost: no heartbeat" "$work/err" || true)
[ -n "$line" ] || fail "no verdict on node 1: $(grep -v '^\[' "$work/err")"
verdict=$(date -d "${line%%Z *}Z" +%s%3N)
echo "# the leader's verdict to gpurun's return: $((end - verdict)) ms"
[ $((end - verdict)) -lt 1000 ] ||
    fail "gpurun returned $((end - verdict)) ms after the leader's verdict, expected under 1000: $(grep -v '^\[' "$work/err")"
sleep 0.5
last=$(cat "$work/alive.1")
[ "$last" -le "$end" ] || fail "node 1's rank wrote at $last, after gpurun returned at $end"
! pgrep -f -- "$mark" >/dev/null || fail "processes of the job left: $(pgrep -af -- "$mark")"
! kill -0 "$victim" 2>/dev/null || fail "node 1's stopped rendezvousd is still there"
got=$(/usr/bin/python3 -c 'import json,sys; f=json.load(open(sys.argv[1]))["first_failure"]; print(f["node"], f.get("class"))' "$job/summary.json")
[ "$got" = "1 node" ] || fail "the record's node and class: $got"
echo "# node 1's daemon stopped: gpurun returned $((end - verdict)) ms after the verdict, nothing left"
