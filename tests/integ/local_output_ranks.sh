#!/usr/bin/env bash
# Progress bars at full width: where gpurun's stdout is a terminal (a pseudo-terminal here),
# each rank gets COLUMNS, the terminal's width less its label ("[0] ", "[10] "), and a COLUMNS
# the user exported is left as it is; to a file, none. --output-ranks LIST shows only those
# ranks' output, stdout and stderr (torchrun's --local-ranks-filter too), while every rank's
# log is whole and a failing rank left out still has its last lines shown; a bad LIST is
# refused in one line.
# timeout: 90
set -euo pipefail
# shellcheck source=local_common.sh
. "$(dirname "$0")/local_common.sh"

py=/usr/bin/python3
[ -x "$py" ] || py=python3
unset COLUMNS

# on_pty COLS OUT CMD...: runs CMD with stdin, stdout and stderr on a pseudo-terminal COLS
# wide, what it wrote there into OUT; sets rc to its exit status.
on_pty() {
    local cols=$1 out=$2
    shift 2
    rc=0
    timeout -k 5 60 "$py" - "$cols" "$@" >"$out" <<'PYEOF' || rc=$?
import fcntl, os, pty, struct, sys, termios
pid, fd = pty.fork()
if pid == 0:
    fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", 40, int(sys.argv[1]), 0, 0))
    os.execvp(sys.argv[2], sys.argv[2:])
out = b""
while True:
    try:
        b = os.read(fd, 65536)
    except OSError:
        break
    if not b:
        break
    out += b
_, st = os.waitpid(pid, 0)
sys.stdout.buffer.write(out.replace(b"\r\n", b"\n"))
sys.exit(os.waitstatus_to_exitcode(st))
PYEOF
}

# --- COLUMNS on a terminal ----------------------------------------------------------------------
# shellcheck disable=SC2016 # expanded by the ranks' shell
on_pty 100 "$work/pty" "$gpurun" --local --gpus-per-node 11 --job-dir "$work/j1" -- \
    sh -c 'echo "cols ${COLUMNS-unset}"'
[ "$rc" = 0 ] || fail "the job on a terminal: exit status $rc: $(cat "$work/pty")"
for r in 0 9; do
    grep -qxF "[$r] cols 96" "$work/pty" || fail "rank $r on a 100-column terminal: $(grep "^\[$r\]" "$work/pty")"
done
grep -qxF "[10] cols 95" "$work/pty" || fail "rank 10 on a 100-column terminal: $(grep '^\[10\]' "$work/pty")"
echo "# COLUMNS on a 100-column terminal: 96 for rank 0, 95 for rank 10"
# The user's own.
# shellcheck disable=SC2016 # expanded by the ranks' shell
COLUMNS=123 on_pty 100 "$work/pty" "$gpurun" --local --job-dir "$work/j2" -- \
    sh -c 'echo "cols ${COLUMNS-unset}"'
grep -qxF "[0] cols 123" "$work/pty" || fail "an exported COLUMNS=123: $(grep '^\[0\]' "$work/pty")"
# A file: none.
# shellcheck disable=SC2016 # expanded by the ranks' shell
run --local -- sh -c 'echo "cols ${COLUMNS-unset}"'
expect_rc 0 "a job to a file"
expect_out_line "[0] cols unset"

# --- --output-ranks -----------------------------------------------------------------------------
# shellcheck disable=SC2016 # expanded by the ranks' shell
run --local -N 2 --gpus-per-node 2 --output-ranks 0,2-3 --job-dir "$work/j3" -- \
    sh -c 'echo "out $RANK"; echo "err $RANK" >&2; printf "partial $RANK"'
expect_rc 0 "--output-ranks 0,2-3"
for r in 0 2 3; do
    expect_out_line "[$r] out $r"
    expect_out_line "[$r] partial $r"
    expect_err "[$r] err $r"
done
! grep -q '^\[1\]' "$work/out" "$work/err" || fail "rank 1 was shown: $(grep -h '^\[1\]' "$work/out" "$work/err")"
# Its two streams are two pipes: in the log in either order.
for r in 0 1 2 3; do
    for text in "out $r" "err $r" "partial $r"; do
        grep -qF "$text" "$work/j3/logs/rank-$r.log" ||
            fail "rank $r's log lacks '$text': $(cat "$work/j3/logs/rank-$r.log")"
    done
done
echo "# --output-ranks 0,2-3: rank 1 left out of the stream, every log whole"
# torchrun's spelling.
# shellcheck disable=SC2016 # expanded by the ranks' shell
run --local --gpus-per-node 3 --local_ranks_filter=1 -- sh -c 'echo "out $RANK"'
expect_rc 0 "--local_ranks_filter=1"
[ "$(cat "$work/out")" = "[1] out 1" ] || fail "--local_ranks_filter=1 showed: $(cat "$work/out")"
# A rank left out that fails: its last lines are still said.
# shellcheck disable=SC2016 # expanded by the ranks' shell
run --local --gpus-per-node 2 --output-ranks 0 -- sh -c '[ "$RANK" = 1 ] || exit 0; echo "why 1"; exit 3'
expect_rc 3 "a left-out rank that fails"
grep -qE 'error:   \| why 1$' "$work/err" || fail "the left-out rank's last line is not said: $(cat "$work/err")"
! grep -q '^\[1\]' "$work/out" || fail "rank 1 was shown: $(cat "$work/out")"
# Bad lists: one line each, nothing started.
for bad in "4:'4' is not a rank 0..3 or a range of them (N-M)" "1,,2:'1,,2' has an empty item" \
    "3-1:'3-1' is not a range: 3 is past 1"; do
    run --local --gpus-per-node 4 --output-ranks "${bad%%:*}" -- true
    expect_rc 125 "--output-ranks ${bad%%:*}"
    [ "$(cat "$work/err")" = "gpurun: --output-ranks: ${bad#*:}" ] ||
        fail "--output-ranks ${bad%%:*}: said '$(cat "$work/err")'"
done
echo "# bad --output-ranks lists: refused in one line"
