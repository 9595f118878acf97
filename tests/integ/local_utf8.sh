#!/usr/bin/env bash
# Whatever a rank prints, its exit is reported and the job ends: an invalid byte, a line of
# box-drawing characters longer than the line the agent keeps for the failure message (cut
# mid-character before), a Lightning-style results table, random binary output and NULs.
# Each failing job exits with its rank's status well within its bound, and summary.json is
# written, valid, with the rank's last lines as valid UTF-8.
# timeout: 180
set -euo pipefail
# shellcheck source=local_common.sh
. "$(dirname "$0")/local_common.sh"

GPURUN_LIMIT=20
py=/usr/bin/python3
[ -x "$py" ] || py=python3

# summary_of ERRFILE: the job dir's summary.json of the last run.
summary_of() {
    local dir
    dir=$(sed -n 's/^gpurun: job [^,]*, job dir \(.*\)$/\1/p' "$1" | head -n 1)
    [ -n "$dir" ] || fail "no job dir line in gpurun's stderr"
    echo "$dir/summary.json"
}

# check_summary WHAT RANK CODE [TEXT]: summary.json of the last run is valid JSON naming RANK
# with exit code CODE as the first failure, and its tail holds TEXT.
check_summary() {
    local f got
    f=$(summary_of "$work/err")
    [ -f "$f" ] || fail "$1: no summary.json"
    got=$("$py" -c '
import json, sys
j = json.load(open(sys.argv[1], encoding="utf-8", errors="strict"))
ff = j["first_failure"]
print(ff["rank"], ff["code"], sys.argv[2] in ff.get("tail", ""))' "$f" "${4:-}") ||
        fail "$1: summary.json is not valid UTF-8 JSON"
    [ "$got" = "$2 $3 True" ] || fail "$1: first_failure rank, code, tail holds '${4:-}': $got"
}

# The two commands of the report: an invalid byte from rank 3 of 4; 80 box-drawing
# characters, a line cut mid-character where the agent keeps its last 239 bytes.
# shellcheck disable=SC2016 # expanded by the ranks' shell
run --local -N 2 --gpus-per-node 2 -- sh -c \
    'if [ $RANK = 3 ]; then printf "\377\n"; exit 3; fi; exec sleep 1000'
expect_rc 3 "rank 3 printing 0xff then exiting 3 while the others sleep"
grep -q "job failed: rank 3 on node 1" "$work/err" || fail "no failure line for rank 3"
check_summary "0xff" 3 3 $'\xef\xbf\xbd'

run --local -- "$py" -c 'print("\u2500" * 80)'
expect_rc 0 "a rank printing 80 box-drawing characters"
grep -qF "$(printf '\u2500%.0s' {1..80})" "$work/out" || fail "the line is not in the stream whole"

"$py" -c 'print("\u2500" * 80)' >"$work/long.txt"
run --local --gpus-per-node 2 -- sh -c "[ \$RANK = 1 ] || exec sleep 1000; cat '$work/long.txt'; exit 4"
expect_rc 4 "a failing rank whose last line is 80 box-drawing characters"
check_summary "box line" 1 4 "$(printf '\u2500%.0s' {1..79})"

# Lightning's end-of-run table, then an exception.
cat >"$work/table.py" <<'EOF'
import os, sys, time
if os.environ["RANK"] != "1":
    time.sleep(1000)
print("┏━━━━━━━━━━━━━━━━━━━━━━━━━━━┳━━━━━━━━━━━━━━━━━━━━━━━━━━━┓")
print("┃        Test metric        ┃       DataLoader 0        ┃")
print("┡━━━━━━━━━━━━━━━━━━━━━━━━━━━╇━━━━━━━━━━━━━━━━━━━━━━━━━━━┩")
print("│         test_loss         │    0.4321 ≈ ½ · π · ∞     │")
print("└───────────────────────────┴───────────────────────────┘", flush=True)
raise SystemExit("done: λ 🚀")
EOF
run --local --gpus-per-node 2 -- "$py" "$work/table.py"
expect_rc 1 "a rank printing a results table, then failing"
check_summary "results table" 1 1 "│         test_loss         │    0.4321 ≈ ½ · π · ∞     │"

# Random bytes (a rank dumping binary to its stdout), NULs among them, then exit 7.
run --local --gpus-per-node 2 -- sh -c \
    "[ \$RANK = 0 ] || exec sleep 1000; head -c 65536 /dev/urandom; printf '\\na\\0b\\n'; exit 7"
expect_rc 7 "a rank printing random bytes, then exiting 7"
check_summary "random bytes" 0 7 $'a\xef\xbf\xbdb'

# The same bytes from a rank that ends well: the job completes, its summary is valid.
run --local -- sh -c "head -c 65536 /dev/urandom; echo"
expect_rc 0 "a rank printing random bytes, then exiting 0"
"$py" -c 'import json, sys; assert json.load(open(sys.argv[1]))["outcome"] == "completed"' \
    "$(summary_of "$work/err")" || fail "random bytes: summary.json"
echo "# invalid bytes, cut characters, tables, binary and NULs: every exit reported"
