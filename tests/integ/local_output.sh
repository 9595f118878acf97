#!/usr/bin/env bash
# The merged output stream with a reader that is slow or never reads: the job ends with its
# own status (heartbeats never wait on output), every logs/rank-N.log is complete, and the
# stream drops lines past what a daemon holds (4 MiB) and says how many, where they are
# missing, once its reader catches up; lines stay whole and in order around the gap.
# timeout: 120
set -euo pipefail
# shellcheck source=local_common.sh
. "$(dirname "$0")/local_common.sh"

# Lines per rank: some 8 MB each, twice what a daemon holds for a slow reader.
n=700000
# A heartbeat timeout shorter than the reader's pause: a loop blocked on output would show, as
# a daemon's stall or a lost node.
hb=(--heartbeat 0.1 --heartbeat-timeout 1)

# check_logs DIR LAST: logs/rank-0.log and rank-1.log are each "seq LAST" exactly, but for
# the line a rank the daemon ended has last, saying why.
check_logs() {
    local r
    for r in 0 1; do
        sed '$ { /^----- gpurun: .*: the rank is ended: .* -----$/d }' "$1/logs/rank-$r.log" |
            cmp -s - <(seq "$2") ||
            fail "logs/rank-$r.log: $(wc -l <"$1/logs/rank-$r.log") lines, expected 'seq $2' exactly"
    done
}

# check_stream LAST: every line of $work/out is a whole "[R] K" line or a notice; each rank's
# K run 1, 2, ... LAST in order, where a gap is exactly what the notice just before it
# counts; prints how many lines each rank had dropped.
check_stream() {
    awk -v last="$1" '
        function bad(what) { printf "line %d: %s: \"%s\"\n", NR, what, $0; failed = 1; exit 1 }
        /^\[[01]\] [0-9]+$/ {
            r = substr($1, 2, 1); k = $2 + 0
            if (k != prev[r] + 1 + pending[r])
                bad("rank " r " expected " prev[r] + 1 + pending[r])
            prev[r] = k; pending[r] = 0; next
        }
        /^\[gpurun\] [0-9,]+ lines? not shown; complete in logs\/rank-[01]\.log$/ {
            r = substr($NF, 11, 1); c = $2; gsub(",", "", c)
            if (pending[r]) bad("two notices for rank " r " without a line between")
            pending[r] = c + 0; dropped[r] += c; next
        }
        { bad("not a whole line of the stream") }
        END {
            if (failed) exit 1
            for (r = 0; r < 2; r++)
                if (prev[r] + pending[r] != last) {
                    printf "rank %d: stream ends at %d + %d dropped, expected %d\n",
                        r, prev[r], pending[r], last
                    exit 1
                }
            printf "%d %d\n", dropped[0], dropped[1]
        }' "$work/out"
}

# 1. The reader pauses 3 s (a pager, Ctrl-S) while each rank prints n lines, then reads; the
#    ranks print 1000 more once it has caught up.
last=$((n + 1000))
start=$SECONDS
{
    rc=0
    timeout -k 5 "$GPURUN_LIMIT" "$gpurun" --local --nodes 2 "${hb[@]}" --job-dir "$work/slow" \
        -- sh -c "seq $n; sleep 5; seq $((n + 1)) $last" 2>"$work/err" </dev/null || rc=$?
    echo "$rc" >"$work/rc"
} | {
    sleep 3
    cat >"$work/out"
}
rc=$(cat "$work/rc")
expect_rc 0 "a job whose reader paused 3 s"
! grep -q "no heartbeat" "$work/err" || fail "a heartbeat waited on the output"
# A daemon excuses its peers for its own loop's stall, so that a loop blocked on the output
# would no longer show as a lost node: it shows as a stall.
! grep -q "daemon stalled for" "$work/err" ||
    fail "a daemon's loop waited on the output: $(grep "daemon stalled for" "$work/err")"
check_logs "$work/slow" "$last"
drops=$(check_stream "$last") || fail "the stream: $drops"
read -r d0 d1 <<<"$drops"
if [ "$d0" -eq 0 ] || [ "$d1" -eq 0 ]; then
    fail "expected lines of both ranks dropped, got $d0 and $d1"
fi
grep -qE "^\[gpurun\] [0-9,]+ lines not shown; complete in logs/rank-0\.log$" "$work/out" ||
    fail "no notice for rank 0"
echo "# paused reader: exit 0 in $((SECONDS - start)) s, logs complete, $d0 and $d1 lines not shown and told"

# 2. A reader that never reads (it holds the pipe open): the job still ends, with its status.
#    (Both ranks finish printing before either exits: the first exit tears the other down.)
mkfifo "$work/fifo"
exec 3<>"$work/fifo"
start=$SECONDS
rc=0
timeout -k 5 "$GPURUN_LIMIT" "$gpurun" --local --nodes 2 "${hb[@]}" --job-dir "$work/stuck" \
    -- sh -c "seq $n; sleep 1.5; exit 3" >"$work/fifo" 2>"$work/err" </dev/null || rc=$?
exec 3>&-
took=$((SECONDS - start))
expect_rc 3 "a job whose reader never reads"
check_logs "$work/stuck" "$n"
grep -q "cannot write the last [0-9]* bytes of the ranks' output: its reader read nothing for 5000 ms" "$work/err" ||
    fail "no warning of the output left unwritten"
[ "$took" -le 20 ] || fail "the job took $took s, expected about 5 s more than it ran"
echo "# reader that never reads: exit 3 in $took s, logs complete"
