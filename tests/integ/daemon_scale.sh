#!/usr/bin/env bash
# Every agent of a job larger than the leader's margin for strangers (1,024 pending
# connections) is admitted: loadgen plays 3,000 agents of 8 ranks (24,000 ranks), all
# connecting at once, through join, a store round, a barrier and the end of the job, against
# a leader-only rendezvousd. An evicted agent fails the run ("the leader closed the link").
# timeout: 90
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${BUILD:-build}
[[ $build == /* ]] || build=$root/$build
rdv=$build/rendezvousd
loadgen=$build/bench/loadgen
for p in "$rdv" "$loadgen"; do
    if [ ! -x "$p" ]; then
        echo "# SKIP '$p' is not built (make all)"
        exit 77
    fi
done
agents=3000
# Descriptors: one per agent in loadgen and in the leader, plus the leader's margins.
need=$((agents + 1024 + 256 + 64))
hard=$(ulimit -Hn)
if [ "$hard" != unlimited ] && [ "$hard" -lt "$need" ]; then
    echo "# SKIP the hard descriptor limit is $hard; $agents agents need $need"
    exit 77
fi
work=$(mktemp -d "${TEST_TMPDIR:-${TMPDIR:-/tmp}}/scale.XXXXXX")

status=0
TMPDIR=$work timeout 60 "$loadgen" rendezvous --agents "$agents" --reps 1 --rendezvousd "$rdv" \
    >"$work/table" 2>"$work/err" || status=$?
cat "$work/table"
if [ "$status" != 0 ]; then
    echo "FAIL: loadgen rendezvous --agents $agents exited $status, want 0"
    sed 's/^/# /' "$work/err" | tail -n 30
    exit 1
fi
row=$(grep "^| $((agents * 8)) | $agents |" "$work/table") ||
    { echo "FAIL: no row for $agents agents in the table"; exit 1; }
if grep -q "evicted" "$work/err"; then
    echo "FAIL: the leader evicted connections of a job it was told to expect"
    sed 's/^/# /' "$work/err" | tail -n 30
    exit 1
fi
echo "all $agents agents admitted: $row"
