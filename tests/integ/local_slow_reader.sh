#!/usr/bin/env bash
# A reader far behind when the job ends: rank 0 prints 500,000 lines and the job ends at
# once, while the stream's reader sleeps 8 s (more than the 5 s the stream waits for it). The
# job must not wait for the reader beyond that, and what the reader finally reads must end
# with the note of what it did not get: the lines shown and the lines the note counts make
# all 500,000, and logs/rank-0.log has every one.
# timeout: 90
set -euo pipefail
# shellcheck source=local_common.sh
. "$(dirname "$0")/local_common.sh"

LINES=500000
t0=$(date +%s%N)
# shellcheck disable=SC2016 # expanded by the ranks' shell
timeout -k 5 60 "$gpurun" --local -N 2 --job-dir "$work/job" -- \
    sh -c "[ \$RANK = 0 ] && seq $LINES; true" 2>&1 </dev/null |
    (
        sleep 8
        cat
    ) >"$work/stream"
ms=$((($(date +%s%N) - t0) / 1000000))
shown=$(grep -c '^\[0\] ' "$work/stream" || true)
note=$(grep '^\[gpurun\] .* not shown' "$work/stream" | tail -n 1 || true)
[ -n "$note" ] || fail "the stream ends without a note of what it left out ($shown lines shown): $(tail -n 3 "$work/stream")"
missing=$(sed -n 's/^\[gpurun\] \([0-9,]*\) lines\{0,1\} not shown.*/\1/p' <<<"$note" | tr -d ,)
[[ $note == *"complete in logs/rank-0.log"* ]] || fail "the note does not say where the lines are: $note"
[ "$((shown + missing))" = "$LINES" ] ||
    fail "$shown lines shown and $missing counted missing make $((shown + missing)), not $LINES"
# The note comes after every line shown.
last_line=$(grep -n '^\[0\] ' "$work/stream" | tail -n 1 | cut -d: -f1)
note_line=$(grep -n '^\[gpurun\] .* not shown' "$work/stream" | tail -n 1 | cut -d: -f1)
[ "$note_line" -gt "${last_line:-0}" ] || fail "the note (line $note_line) is not after the last line shown ($last_line)"
[ "$(wc -l <"$work/job/logs/rank-0.log")" = "$LINES" ] || fail "logs/rank-0.log is not complete"
echo "# reader 8 s behind: $shown lines shown, $missing counted in the last note, ${ms} ms in all"
