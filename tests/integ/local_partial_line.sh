#!/usr/bin/env bash
# A line without its end is seen while it is current, to a file and to a pipe: after a short
# quiet (300 ms) what the rank wrote is written as a labelled line, and what it adds later as
# another, so that tail -f of a batch output file shows a progress bar's state at once, not one
# update late, without a byte written twice, and every line of the file still one rank's. The
# rank's log keeps its bytes as written.
# timeout: 120
set -euo pipefail
# shellcheck source=local_common.sh
. "$(dirname "$0")/local_common.sh"

# seen_within FILE TEXT MS: FILE has a line with TEXT within MS ms; sets took to how long it
# took.
seen_within() {
    local t0
    t0=$(date +%s%N)
    while :; do
        took=$((($(date +%s%N) - t0) / 1000000))
        grep -qF -- "$2" "$1" 2>/dev/null && break
        [ "$took" -lt "$3" ] || fail "'$2' not in $1 within $3 ms: $(od -c "$1" 2>/dev/null | head -n 4)"
        sleep 0.02
    done
}

# rank_wrote JOBDIR: waits (up to 10 s) for rank 0's first bytes in its log, so that what
# follows is timed from the rank's start, not from gpurun's.
rank_wrote() {
    local i
    for ((i = 0; i < 500; i++)); do
        [ -s "$1/logs/rank-0.log" ] && return 0
        sleep 0.02
    done
    fail "rank 0 wrote nothing in 10 s: $(cat "$work/err")"
}

# The issue's case: a '\r' bar whose state waits 5 s for the next, to a file.
job=$work/job
"$gpurun" --local --job-dir "$job" -- sh -c 'printf "\rstep-1"; sleep 5; printf "\rstep-2\n"' \
    >"$work/out" 2>"$work/err" </dev/null &
gp=$!
bg_pids+=("$gp")
rank_wrote "$job"
seen_within "$work/out" '[0] step-1' 1000
echo "# a carriage-return bar's state waiting for the next: in the file after $took ms"
wait "$gp" || fail "the bar job failed: $(cat "$work/err")"
[ "$(cat "$work/out")" = $'[0] step-1\n[0] step-2' ] ||
    fail "the file is not each state once, labelled: $(od -c "$work/out" | head -n 6)"
[ "$(cat "$job/logs/rank-0.log")" = $'\rstep-1\rstep-2' ] ||
    fail "the rank's log is not its bytes: $(od -c "$job/logs/rank-0.log")"

# A line the rank ends later, to a pipe: its start at once, then the rest as a line of its own
# (nothing written twice); a line written whole stays whole.
job=$work/job2
"$gpurun" --local --job-dir "$job" -- sh -c 'printf "loading... "; sleep 3; echo done; echo "a whole line"' \
    2>"$work/err" </dev/null | cat >"$work/out" &
gp=$!
bg_pids+=("$gp")
rank_wrote "$job"
seen_within "$work/out" '[0] loading... ' 1000
echo "# a line without its end through a pipe: its start after $took ms"
wait "$gp" || fail "the pipe job failed: $(cat "$work/err")"
[ "$(cat "$work/out")" = $'[0] loading... \n[0] done\n[0] a whole line' ] ||
    fail "the pipe got other than start, rest and whole line: $(od -c "$work/out" | head -n 8)"
[ "$(cat "$job/logs/rank-0.log")" = $'loading... done\na whole line' ] ||
    fail "the rank's log is not its lines: $(cat "$job/logs/rank-0.log")"

# Two ranks, each with a line that waits and then ends with '\r\n': every line of the file is
# one rank's, each rank's text once.
# shellcheck disable=SC2016 # expanded by the ranks' shell
run --local --gpus-per-node 2 -- sh -c 'printf "rank %s at 50%%" "$RANK"; sleep 1; printf "\r\n"
    printf "rank %s at 100%%\n" "$RANK"'
expect_rc 0 "two ranks with lines that wait"
bad=$(grep -cv '^\[[01]\] rank [01] at [0-9]*%$' "$work/out" || true)
[ "$bad" = 0 ] || fail "$bad lines of the file are not one rank's: $(cat "$work/out")"
for r in 0 1; do
    for p in 50 100; do
        [ "$(grep -cxF "[$r] rank $r at $p%" "$work/out")" = 1 ] ||
            fail "rank $r's '$p%' is not in the file once: $(cat "$work/out")"
    done
done
echo "# two ranks' waiting lines: each state once, labelled"
