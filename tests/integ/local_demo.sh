#!/bin/bash
# make run's demo (scripts/demo.sh, two steps) leaves nothing behind: its temp dir
# (gpurun-demo.*) and the jobs root's link to the job dir in it are gone once it ends; with
# DEMO_KEEP=1 both stay, and the demo says where.
# timeout: 120
set -euo pipefail
# shellcheck source=local_common.sh
. "$(dirname "$0")/local_common.sh"
need_built gpurun-train
[ -r /usr/share/info/coreutils.info.gz ] || skip "no coreutils manual to make the demo corpus from"

export TMPDIR=$work/tmp GPURUN_JOBS=$work/jobs
mkdir -p "$TMPDIR"
fail_show=(demo.out)
rc=0
BUILD=$build timeout 100 "$root/scripts/demo.sh" train.steps=2 >"$work/demo.out" 2>&1 || rc=$?
expect_rc 0 "scripts/demo.sh train.steps=2"
left=$(find "$TMPDIR" "$GPURUN_JOBS" -mindepth 1 -maxdepth 1 2>/dev/null)
[ -z "$left" ] || fail "the demo left: $left"
grep -q "is removed: DEMO_KEEP=1 keeps it" "$work/demo.out" || fail "the demo does not say its dir is removed"

rc=0
DEMO_KEEP=1 BUILD=$build timeout 100 "$root/scripts/demo.sh" train.steps=2 >"$work/demo.out" 2>&1 || rc=$?
expect_rc 0 "DEMO_KEEP=1 scripts/demo.sh train.steps=2"
kept=("$TMPDIR"/gpurun-demo.*)
[ -f "${kept[0]}/job/summary.json" ] || fail "DEMO_KEEP=1: no job dir kept in $TMPDIR"
[ "$(find "$GPURUN_JOBS" -mindepth 1 -maxdepth 1 -type l | wc -l)" = 1 ] ||
    fail "DEMO_KEEP=1: not one link in the jobs root"
grep -qF "Checkpoints and metrics.jsonl: ${kept[0]}/out" "$work/demo.out" ||
    fail "DEMO_KEEP=1: the demo does not say where its checkpoints are"
echo "# the demo removes its temp dir and link; DEMO_KEEP=1 keeps them"
