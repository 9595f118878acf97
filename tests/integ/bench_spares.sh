#!/bin/bash
# The lost-node benchmark itself, one run of each case: bench/spares.sh's table has both rows,
# each with a median, min and max in ms, and the spare's row (the restart's 1 s backoff
# included) comes in under 10 s.
# timeout: 90
set -euo pipefail

# shellcheck source=prologue.sh
. "$(dirname "$0")/prologue.sh"
fail_show=(out err)
need_built gpurun rendezvousd

timeout -k 5 80 "$root/bench/spares.sh" "$build/gpurun" 1 >"$work/out" 2>"$work/err" ||
    fail "spares.sh exited with status $?"
spare=$(sed -n 's/^| with a spare: [^|]* | \([0-9]*\) | [0-9]* | [0-9]* |$/\1/p' "$work/out")
none=$(sed -n 's/^| without a spare: [^|]* | \([0-9]*\) | [0-9]* | [0-9]* |$/\1/p' "$work/out")
{ [ -n "$spare" ] && [ -n "$none" ]; } || fail "the table lacks a row: $(cat "$work/out")"
[ "$spare" -ge 1000 ] || fail "with a spare in $spare ms: under the restart's 1 s backoff"
[ "$spare" -lt 10000 ] || fail "with a spare: $spare ms"
echo "# with a spare: $spare ms; without: $none ms"
