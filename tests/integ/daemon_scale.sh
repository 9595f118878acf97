#!/usr/bin/env bash
# Every agent of a job larger than the leader's margin for strangers (1,024 pending
# connections) is admitted: loadgen plays 3,000 agents of 8 ranks (24,000 ranks), all
# connecting at once, through join, a store round, a barrier and the end of the job, against
# a leader-only rendezvousd. An evicted agent fails the run ("the leader closed the link").
# timeout: 90
set -euo pipefail

# shellcheck source=prologue.sh
. "$(dirname "$0")/prologue.sh"
fail_show=(err)
show_lines=30
need_built --hint "make all" rendezvousd bench/loadgen
rdv=$build/rendezvousd
loadgen=$build/bench/loadgen
agents=3000
# Descriptors: one per agent in loadgen and in the leader, plus the leader's margins.
need=$((agents + 1024 + 256 + 64))
hard=$(ulimit -Hn)
if [ "$hard" != unlimited ] && [ "$hard" -lt "$need" ]; then
    skip "the hard descriptor limit is $hard; $agents agents need $need"
fi

status=0
TMPDIR=$work timeout 60 "$loadgen" rendezvous --agents "$agents" --reps 1 --rendezvousd "$rdv" \
    >"$work/table" 2>"$work/err" || status=$?
cat "$work/table"
[ "$status" = 0 ] || fail "loadgen rendezvous --agents $agents exited $status, want 0"
row=$(grep "^| $((agents * 8)) | $agents |" "$work/table") ||
    fail "no row for $agents agents in the table"
! grep -q "evicted" "$work/err" ||
    fail "the leader evicted connections of a job it was told to expect"
echo "all $agents agents admitted: $row"
