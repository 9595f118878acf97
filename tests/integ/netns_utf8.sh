#!/bin/bash
# A rank's output that is not ASCII, across nodes: two nodes in their own network namespaces,
# two ranks on each; rank 3 (node 1) prints a results table of box-drawing characters, a line
# of them cut where the agent keeps the line, an invalid byte and a NUL, then exits 3 while the
# others sleep. Its exit must cross the link to the leader: every daemon exits 3 within a few
# seconds and summary.json names rank 3 with its last lines as valid UTF-8.
# timeout: 60
# lane: side
set -euo pipefail
# shellcheck source=tests/netns.sh disable=SC1091
. "$(dirname "$0")/../netns.sh"

NODES=2
NPROCS=2
DEADLINE_MS=${NETNS_UTF8_DEADLINE_MS:-10000}
netns_test_begin "$NODES" rendezvousd
job=$NETNS_WORK/job-u8-$$

# shellcheck disable=SC2016 # expanded by the rank's shell
rank_sh='[ "$RANK" = 3 ] || exec sleep 1000
printf "\342\224\214\342\224\200\342\224\200\342\224\254\342\224\200\342\224\220\n"
printf "\342\224\202 loss \342\224\202 0.43 \342\224\202\n"
i=0; while [ $i -lt 80 ]; do printf "\342\224\200"; i=$((i + 1)); done; echo
printf "bad \377 byte, nul a\000b\n"
exit 3'
netns_job_write "$job" "$NODES" "$NPROCS" "\"join_timeout_ms\": 20000, \"kill_grace_ms\": 1000" \
    /bin/sh -c "$rank_sh"
t0=$(netns_now_ms)
netns_job_start "$job" "$NETNS_WORK" "$NETNS_BUILD/rendezvousd"
for ((k = 0; k < NODES; k++)); do
    wait_ms=$((DEADLINE_MS - ($(netns_now_ms) - t0)))
    netns_wait "${NETNS_DAEMONS[k]}" $((wait_ms > 0 ? wait_ms : 0)) ||
        fail "node $k's rendezvousd still runs $DEADLINE_MS ms after the start (rank 3's exit lost?)"
    [ "$NETNS_STATUS" = 3 ] || fail "node $k's rendezvousd exited with $NETNS_STATUS, not 3"
done
echo "# every daemon exited 3 in $(($(netns_now_ms) - t0)) ms"

[ -f "$job/summary.json" ] || fail "the leader wrote no summary.json"
got=$(netns_json "$job/summary.json" '[j["first_failure"]["rank"], j["first_failure"]["code"]]')
[ "$got" = "[3, 3]" ] || fail "summary.json first_failure rank, code = $got"
tail_ok=$(netns_json "$job/summary.json" \
    '["│ loss │ 0.43 │" in j["first_failure"]["tail"], "bad \ufffd byte, nul a\ufffdb" in j["first_failure"]["tail"], "─" * 79 in j["first_failure"]["tail"]]')
[ "$tail_ok" = "[true, true, true]" ] || fail "summary.json's tail lacks the rank's lines: $tail_ok"
echo "# rank 3's table, cut line, invalid byte and NUL reached the leader across the link"
