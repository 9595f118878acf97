#!/usr/bin/env bash
# --metrics-dir: while a 2-node job of reporting ranks runs, each node's daemon keeps
# gpurun_<id>_node<k>.prom in the folder, valid for Prometheus (promtool check metrics, from
# Debian's prometheus package) and holding each of its ranks' step and loss and its state;
# the files are gone when the job ends. A folder that cannot be written to is said once and
# the job runs on.
# timeout: 60
set -euo pipefail
# shellcheck source=local_common.sh
. "$(dirname "$0")/local_common.sh"

example=$build/tests/gr_example
[ -x "$example" ] || skip "'$example' is not built"
mdir=$work/metrics
mkdir "$mdir"
job=$work/job
"$gpurun" --local -N 2 --gpus-per-node 2 --job-dir "$job" --metrics-dir "$mdir" \
    -- "$example" --steps 60 --step-ms 100 >"$work/out" 2>"$work/err" </dev/null &
pid=$!
bg_pids+=("$pid")
id=$(wait_job_id "$work/err")
[ -n "$id" ] || fail "no job line"
f0=$mdir/gpurun_${id}_node0.prom
f1=$mdir/gpurun_${id}_node1.prom
# The first files come at the start; the ranks' steps in the next ones (every 5 s).
for ((i = 0; i < 150; i++)); do
    if [ -s "$f0" ] && [ -s "$f1" ] &&
        grep -qE "^gpurun_rank_step\\{job=\"$id\",node=\"1\",rank=\"3\"\\} [1-9]" "$f1"; then
        break
    fi
    sleep 0.1
done
if [ ! -s "$f0" ] || [ ! -s "$f1" ]; then fail "no metrics files: $(ls -A "$mdir")"; fi
for f in "$f0" "$f1"; do
    grep -qE "^gpurun_node_state\\{job=\"$id\",node=\"[01]\",host=\"[^\"]+\",state=\"running\"\\} 1$" "$f" ||
        fail "${f##*/} does not say running: $(grep node_state "$f")"
done
for r in 0 1; do
    grep -qE "^gpurun_rank_step\\{job=\"$id\",node=\"0\",rank=\"$r\"\\} [1-9][0-9]*$" "$f0" ||
        fail "no step of rank $r in ${f0##*/}: $(grep rank_step "$f0")"
    grep -qE "^gpurun_rank_loss\\{job=\"$id\",node=\"0\",rank=\"$r\"\\} [0-9.e+-]+$" "$f0" ||
        fail "no loss of rank $r in ${f0##*/}"
done
grep -qE "^gpurun_rank_step\\{job=\"$id\",node=\"1\",rank=\"3\"\\} [1-9]" "$f1" ||
    fail "no step of rank 3 in ${f1##*/}: $(grep rank_step "$f1")"
if command -v promtool >/dev/null; then
    for f in "$f0" "$f1"; do
        promtool check metrics <"$f" >"$work/promtool" 2>&1 ||
            fail "promtool check metrics refuses ${f##*/}: $(cat "$work/promtool")"
    done
    echo "# promtool check metrics: both files valid"
else
    echo "# promtool not installed (Debian's prometheus, scripts/deps.sh): format not checked by it"
fi
rc=0
wait "$pid" || rc=$?
[ "$rc" = 0 ] || fail "the job exited $rc"
[ -z "$(ls -A "$mdir")" ] || fail "files left after the job: $(ls -A "$mdir")"
echo "# metrics files of both nodes while the job ran, gone at its end"

# A folder that does not exist: one warning per node, the job completes.
run --local -N 2 --metrics-dir "$work/none" -- "$example" --steps 3
expect_rc 0 "a job whose metrics folder does not exist"
[ "$(grep -c "cannot write metrics into '$work/none'" "$work/err")" = 2 ] ||
    fail "not one warning per node: $(grep -c 'cannot write metrics' "$work/err")"
