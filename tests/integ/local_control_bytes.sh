#!/usr/bin/env bash
# Control bytes stay out of gpurun's own lines: a failing rank whose last lines and exception
# hold escape sequences (ESC, BEL, a C1 CSI, DEL, a stray byte) has them escaped ("\x1b") in
# the 'error:   | ...' lines of its failure and in gpurun status's record, while its own
# labelled stream passes them through as a terminal expects.
# timeout: 60
set -euo pipefail
# shellcheck source=local_common.sh
. "$(dirname "$0")/local_common.sh"

# no_controls FILE WHAT: FILE holds no control byte but tab and newline, no DEL, no C1.
no_controls() {
    if LC_ALL=C grep -qP '[\x00-\x08\x0b-\x1f\x7f]|\xc2[\x80-\x9f]' "$1"; then
        fail "$2 holds control bytes: $(LC_ALL=C grep -P '[\x00-\x08\x0b-\x1f\x7f]|\xc2[\x80-\x9f]' "$1" | od -c | head -n 8)"
    fi
}

# The rank prints two lines with escapes (a colour, a title set with BEL, a clear screen by
# C1 CSI, DEL, a byte that is not UTF-8), then raises an exception whose message has them too.
job=$work/job
run --local --job-dir "$job" -- python3 -c 'import sys
sys.stdout.write("plain\n\x1b[31mred\x1b[0m \x1b]0;title\x07 csi\xc2\x9b2J del\x7f\n".encode("latin-1").decode("utf-8"))
sys.stdout.flush()
sys.stdout.buffer.write(b"bad\xff byte\n")
sys.stdout.flush()
sys.exit(3)'
expect_rc 3 "a rank that exits 3"
cat -v "$work/err"

# The rank's own stream: its bytes as it wrote them.
grep -qF $'[0] \e[31mred\e[0m \e]0;title\a csi\xc2\x9b2J del\x7f' "$work/out" ||
    fail "the rank's stream lost its escapes: $(od -c "$work/out" | head -n 6)"

# gpurun's own lines: the failure and its last lines, escaped.
no_controls "$work/err" "gpurun's stderr"
grep -qF 'error:   | \x1b[31mred\x1b[0m \x1b]0;title\x07 csi\u009b2J del\x7f' "$work/err" ||
    fail "no escaped last line in the failure: $(grep -F '|' "$work/err")"
# The tail is kept as valid UTF-8: U+FFFD stands for the stray byte.
grep -qF $'error:   | bad\xef\xbf\xbd byte' "$work/err" || fail "the stray byte's line: $(grep -F bad "$work/err")"
grep -qF 'error:   | plain' "$work/err" || fail "the plain last line is missing: $(cat "$work/err")"

# gpurun status: the record's last lines and exception, escaped.
timeout 30 "$gpurun" status --job-dir "$job" >"$work/status" 2>&1 || true
cat -v "$work/status"
no_controls "$work/status" "gpurun status"
grep -qF '  \x1b[31mred\x1b[0m \x1b]0;title\x07 csi\u009b2J del\x7f' "$work/status" ||
    fail "gpurun status shows no escaped last line: $(cat -v "$work/status")"

# An exception recorded for the rank (TORCHELASTIC_ERROR_FILE's record) with escapes in its
# message: escaped in the failure's cause and in gpurun status.
job2=$work/job2
run --local --job-dir "$job2" -- python3 -c 'import json, os, sys
json.dump({"message": {"message": "ValueError: bad \u001b[2Jinput\u0007", "extraInfo": {"py_callstack": "", "timestamp": "0"}}}, open(os.environ["TORCHELASTIC_ERROR_FILE"], "w"))
sys.exit(1)'
expect_rc 1 "a rank with a recorded exception"
cat -v "$work/err"
no_controls "$work/err" "gpurun's stderr (an exception)"
timeout 30 "$gpurun" status --job-dir "$job2" >"$work/status2" 2>&1 || true
cat -v "$work/status2"
no_controls "$work/status2" "gpurun status (an exception)"
grep -qF '\x1b[2Jinput\x07' "$work/status2" ||
    fail "gpurun status shows no escaped exception: $(cat -v "$work/status2")"
echo "# control bytes: escaped in gpurun's lines, kept in the rank's stream"
