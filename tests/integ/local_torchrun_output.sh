#!/usr/bin/env bash
# Output as torchrun's users expect it: a rank's stderr reaches gpurun's stderr and its stdout
# gpurun's stdout (one file when they are one: 2>&1 keeps both); a progress bar redrawn with
# '\r' is seen as it moves, not held until its newline (a printf loop, and tqdm itself where
# PyPI gives it), and in a file each redraw is a labelled line of its own; a line written in
# two quick halves is one line in a file; a line past 4000 bytes comes in pieces cut between
# characters; a job that ends well says so in one line, and ^C says cancelled.
# timeout: 180
set -euo pipefail
# shellcheck source=local_common.sh
. "$(dirname "$0")/local_common.sh"

py=/usr/bin/python3
[ -x "$py" ] || py=python3

# --- stderr to stderr ---------------------------------------------------------------------
# shellcheck disable=SC2016 # expanded by the ranks' shell
run --local --gpus-per-node 2 -- sh -c 'echo "err $RANK" >&2; echo "out $RANK"'
expect_rc 0 "a job writing to both streams"
for r in 0 1; do
    grep -qxF "[$r] out $r" "$work/out" || fail "stdout lacks '[$r] out $r'"
    grep -qxF "[$r] err $r" "$work/err" || fail "stderr lacks '[$r] err $r'"
done
! grep -q 'err' "$work/out" || fail "a rank's stderr reached gpurun's stdout: $(grep err "$work/out")"
! grep -q '\] out' "$work/err" || fail "a rank's stdout reached gpurun's stderr"
# 2>&1: one file, both.
timeout -k 5 60 "$gpurun" --local -- sh -c 'echo e >&2; echo o' >"$work/both" 2>&1 </dev/null
if ! grep -qxF '[0] e' "$work/both" || ! grep -qxF '[0] o' "$work/both"; then
    fail "2>&1 lost a stream: $(cat "$work/both")"
fi

# --- the one line at the end ----------------------------------------------------------------
grep -qE "^gpurun: job 'local-[^']*' completed in [0-9]+\.[0-9] s; logs in '.*/logs'$" "$work/err" ||
    fail "no completion line: $(tail -n 2 "$work/err")"
timeout -k 5 60 "$gpurun" --local -N 2 -- sleep 30 >"$work/c.out" 2>"$work/c.err" </dev/null &
gp=$!
bg_pids+=("$gp")
sleep 1.5
kill -INT "$gp"
rc=0
wait "$gp" || rc=$?
[ "$rc" = 130 ] || fail "^C: exit status $rc, not 130"
grep -qE "^gpurun: job 'local-[^']*' cancelled \(SIGINT\); logs in" "$work/c.err" ||
    fail "^C: no 'cancelled' line: $(tail -n 3 "$work/c.err")"
! grep -q 'job failed' "$work/c.err" || fail "^C is called a failure: $(grep 'job failed' "$work/c.err")"

# --- progress bars --------------------------------------------------------------------------
# bar_seen STREAM CMD...: runs gpurun with CMD, its stdout in $work/bar and its stderr in
# $work/bar.err; prints how many states of rank 0's line STREAM (bar or bar.err) had shown
# before the job ended (polled until 3 had, or the job ended).
bar_seen() {
    local stream=$1 n=0
    shift
    timeout -k 5 60 "$gpurun" --local -- "$@" >"$work/bar" 2>"$work/bar.err" </dev/null &
    local gp=$!
    bg_pids+=("$gp")
    while kill -0 "$gp" 2>/dev/null; do
        n=$(tr '\r' '\n' <"$work/$stream" | grep -c '^\[0\] ' || true)
        [ "$n" -ge 3 ] && break
        sleep 0.05
    done
    echo "$n"
    wait "$gp" || fail "the progress job failed: $(cat "$work/bar.err")"
}
n=$(bar_seen bar "$py" -c 'import sys, time
for i in range(10):
    sys.stdout.write(f"\r{i}"); sys.stdout.flush(); time.sleep(0.5)
print()')
[ "$n" -ge 3 ] || fail "a '\\r' progress line: $n of its 10 states shown before its newline"
tr '\r' '\n' <"$work/bar" | grep -qxF '[0] 9' || fail "the bar's last state is missing: $(od -c "$work/bar" | tail -n 3)"
echo "# a carriage-return bar: its states on the stream as it moved"

# tqdm itself, where PyPI gives it.
if "$py" -m pip --version >/dev/null 2>&1 &&
    timeout 120 "$py" -m pip download --disable-pip-version-check --no-deps --only-binary :all: \
        -d "$work/dl" tqdm >"$work/pip.log" 2>&1; then
    # tqdm draws on stderr.
    n=$(PYTHONPATH=$(echo "$work"/dl/tqdm-*.whl) bar_seen bar.err "$py" -c 'import time
from tqdm import tqdm
for _ in tqdm(range(12), mininterval=0):
    time.sleep(0.4)')
    [ "$n" -ge 3 ] ||
        fail "tqdm's bar: $n states on gpurun's stderr before it ended: $(od -c "$work/bar.err" | head -n 5)"
    grep -qF '12/12' "$work/bar.err" || fail "tqdm's last state is missing"
    echo "# tqdm's bar: its states on the stream as it moved"
else
    echo "# tqdm not checked: PyPI not reachable ($(tail -n 1 "$work/pip.log" 2>/dev/null))"
fi

# To a file, two ranks' bars stay apart: each redraw is a line of its own, labelled (a '\r'
# would leave both ranks' redraws on one line of the file, mixed).
# shellcheck disable=SC2016 # expanded by the ranks' shell
run --local --gpus-per-node 2 -- sh -c 'for i in 0 25 50 75 100; do printf "\rprogress %d%%" $i
    sleep 0.1; done; echo'
expect_rc 0 "two ranks drawing bars"
! grep -q $'\r' "$work/out" || fail "a file got a '\\r': $(od -c "$work/out" | head -n 5)"
bad=$(grep -cv '^\[[01]\] ' "$work/out" || true)
[ "$bad" = 0 ] || fail "$bad lines of the file are not one rank's: $(head -n 5 "$work/out")"
for r in 0 1; do
    grep -qxF "[$r] progress 100%" "$work/out" || fail "rank $r's last state is not a line: $(cat "$work/out")"
done
echo "# two ranks' bars to a file: each redraw a labelled line of its own"

# --- a long line ------------------------------------------------------------------------------
# Past 4000 bytes the stream carries a line in pieces, each cut between characters (valid
# UTF-8, the pieces together the line); the rank's log keeps it whole.
run --local -- "$py" -c 'import sys; sys.stdout.write("a" + "\u20ac" * 5000 + "\U0001F600" * 2000 + "\n")'
expect_rc 0 "a 23 KB line of 3- and 4-byte characters"
"$py" - "$work/out" <<'PYEOF' || fail "the long line's pieces: see above"
import sys
want = "a" + "\u20ac" * 5000 + "\U0001F600" * 2000
pieces = open(sys.argv[1], "rb").read().split(b"\n")[:-1]
assert len(pieces) >= 6, f"{len(pieces)} pieces"
texts = []
for p in pieces:
    assert p.startswith(b"[0] "), p[:20]
    assert len(p) <= 4004, len(p)
    texts.append(p[4:].decode("utf-8"))  # raises on a split character
assert "".join(texts) == want, "the pieces do not make the line"
print(f"# a 23 KB line: {len(pieces)} pieces, each valid UTF-8, together the line")
PYEOF
logdir=$(sed -n "s/^gpurun: job '[^']*' completed in .* logs in '\(.*\)'$/\1/p" "$work/err")
if [ -z "$logdir" ] || [ "$(wc -c <"$logdir/rank-0.log")" != $((1 + 3 * 5000 + 4 * 2000 + 1)) ]; then
    fail "rank-0.log does not hold the line whole: $(wc -c <"$logdir/rank-0.log" 2>&1)"
fi

# --- a line without its end ---------------------------------------------------------------------
# To a terminal (a pty from script(1)) it is shown as it stands, before its end comes.
if command -v script >/dev/null; then
    timeout -k 5 30 script -qfec "'$gpurun' --local -- sh -c 'printf waiting; sleep 2; echo done'" \
        "$work/pty" >/dev/null 2>&1 </dev/null &
    sp=$!
    bg_pids+=("$sp")
    seen=0
    for ((i = 0; i < 30; i++)); do
        grep -aq '^\[0\] waiting' "$work/pty" 2>/dev/null && seen=1 && break
        sleep 0.05
    done
    [ "$seen" = 1 ] || fail "a line without its end was not shown on a terminal within 1.5 s"
    wait "$sp" || true
    echo "# a line without its end: shown on a terminal before it ended"
else
    echo "# no script(1): the terminal case is not checked"
fi
# To a file, a line written in two halves within the quiet (300 ms) is one line, whole (one
# that waits longer comes in labelled pieces: local_partial_line).
run --local -- sh -c 'printf "half "; sleep 0.05; echo line'
expect_rc 0 "a line written in two halves"
if [ "$(cat "$work/out")" != "[0] half line" ] || grep -q $'\r' "$work/out"; then
    fail "a file got other than the whole line: $(od -c "$work/out" | head -n 3)"
fi
