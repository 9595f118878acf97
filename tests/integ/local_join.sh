#!/usr/bin/env bash
# A node that never joins, or whose daemon is killed before it joins: the join timeout fires on time, names the missing node (exit 124),
# and every daemon exits by itself, those that joined and the one still trying included.
# timeout: 60
set -euo pipefail
# shellcheck source=local_common.sh
. "$(dirname "$0")/local_common.sh"

# gpurun runs the rendezvousd beside it: a wrapper there decides what node $BAD_NODE does.
mkdir -p "$work/bin"
cp "$gpurun" "$work/bin/gpurun"
cat >"$work/bin/rendezvousd" <<WRAP
#!/bin/sh
case " \$* " in
*" --node-rank \$BAD_NODE "*)
    [ "\$BAD_HOW" = kill ] && kill -KILL \$\$
    exec "$build/rendezvousd" "\$@" --rendezvous 127.0.0.1:1 ;;
esac
exec "$build/rendezvousd" "\$@"
WRAP
chmod +x "$work/bin/rendezvousd"

# never: node 2's daemon dials a port where no leader listens; kill: it dies of SIGKILL
# before it starts (gpurun, its parent, sees the signal).
for how in never kill; do
    start=$(date +%s%N)
    rc=0
    BAD_NODE=2 BAD_HOW=$how timeout -k 5 "$GPURUN_LIMIT" "$work/bin/gpurun" --local --nodes 3 \
        --join-timeout 2 --job-dir "$work/$how" -- sleep 30 >"$work/out" 2>"$work/err" || rc=$?
    ms=$((($(date +%s%N) - start) / 1000000))
    [ "$rc" = 124 ] || fail "node 2 ($how): exit status $rc, expected 124"
    [ "$ms" -lt 5000 ] || fail "node 2 ($how): took $ms ms, expected about 2000"
    grep -q 'missing nodes: 2"' "$work/$how/summary.json" ||
        fail "node 2 ($how): summary.json lacks 'missing nodes: 2': $(grep cause "$work/$how/summary.json")"
    grep -q '"exit_status": 124' "$work/$how/summary.json" ||
        fail "node 2 ($how): summary.json's status is not 124"
    ! grep -q "still running\|did not stop" "$work/err" ||
        fail "node 2 ($how): a daemon had to be stopped by gpurun"
    ! pgrep -f "rendezvousd --job-dir $work/$how " >/dev/null ||
        fail "node 2 ($how): daemons left: $(pgrep -af "rendezvousd --job-dir $work/$how ")"
    echo "ok - node 2 $how: join timeout after $ms ms, missing node 2 named, every daemon exited"
done
