#!/usr/bin/env bash
# gpurun's exit statuses and messages with the real daemon: the job's own status, 127 and 126
# for commands that cannot run (checked before anything starts), 125 for refused command
# lines, each with its one-line message.
# timeout: 120
set -euo pipefail
# shellcheck source=local_common.sh
. "$(dirname "$0")/local_common.sh"

run --local -- true
expect_rc 0 "'-- true'"
[ ! -s "$work/out" ] || fail "'-- true' printed something"

run --local --gpus-per-node 2 -- sh -c 'exit 3'
expect_rc 3 "ranks exiting 3"
grep -q "exited with status 3" "$work/err" || fail "no failure message for status 3"

# shellcheck disable=SC2016 # expanded by the ranks' shell
run --local --nodes 2 --gpus-per-node 2 -- sh -c '[ "$RANK" != 3 ] || exit 5; sleep 0.2'
expect_rc 5 "rank 3 of 2 nodes exiting 5"

run --local -- sh -c 'kill -KILL $$'
expect_rc 137 "a rank killed by SIGKILL"

# A command that cannot run: nothing is started, no job dir is made.
run --local --job-dir "$work/never" -- gpurun-no-such-command-xyz arg
expect_rc 127 "an unknown command"
expect_err "gpurun: 'gpurun-no-such-command-xyz': command not found"
[ ! -e "$work/never" ] || fail "a job dir was made for a command that does not exist"

run --local -- ./no/such/path
expect_rc 127 "a missing path"
expect_err "gpurun: './no/such/path': no such file"

printf '#!/bin/sh\n' >"$work/noexec"
chmod 0644 "$work/noexec"
run --local -- "$work/noexec"
expect_rc 126 "a file that is not executable"
expect_err "gpurun: '$work/noexec': permission denied (not an executable file)"

# Refused command lines: 125 and the message.
run --local --nodes abc -- true
expect_rc 125 "--nodes abc"
expect_err "gpurun: --nodes: 'abc' is not a number"
run --local --nodes 0 -- true
expect_rc 125 "--nodes 0"
expect_err "gpurun: --nodes: must be 1..65536"
run --local --frob -- true
expect_rc 125 "--frob"
expect_err "gpurun: unknown option '--frob' (see 'gpurun --help')"
run --local
expect_rc 125 "no command"
grep -q "no command to run" "$work/err" || fail "no message for a missing command"
SLURM_CONF=$work/no-slurm.conf run -- true
expect_rc 125 "no Slurm"
expect_err "gpurun: no Slurm configuration: SLURM_CONF names '$work/no-slurm.conf', which does not exist"
printf '[job]\n' >"$work/tiny.cfg"
run --local "$work/tiny.cfg"
expect_rc 125 "a train.cfg without data"
expect_err "gpurun: $work/tiny.cfg: [data] train is not set"
# Data not made yet (a first run): refused before anything starts, with the command that
# makes it.
printf '[data]\ntrain = shards/train_*.bin\n' >"$work/nodata.cfg"
run --local --job-dir "$work/nodata-job" "$work/nodata.cfg"
expect_rc 125 "a train.cfg whose data is not made"
expect_err "gpurun: $work/nodata.cfg: data.train: '$work/shards/train_*.bin': no file matches; make token shards with 'gpurun-train prep TEXT... -o DIR'"
[ ! -e "$work/nodata-job" ] || fail "a job dir was made for a job whose data is missing"
SLURM_CONF=$work/no-slurm.conf run cancel 42
expect_rc 125 "cancel without Slurm"
expect_err "gpurun: no Slurm configuration: SLURM_CONF names '$work/no-slurm.conf', which does not exist"

# The daemon's own failure is gpurun's: a job dir that is not empty is refused up front.
mkdir -p "$work/full" && touch "$work/full/something"
run --local --job-dir "$work/full" -- true
expect_rc 125 "a job dir that is not empty"
grep -q "is not empty" "$work/err" || fail "no message for a job dir that is not empty"

run --help
expect_rc 0 "--help"
grep -q -- "--gpus-per-node" "$work/out" || fail "--help does not list --gpus-per-node"
run --version
expect_rc 0 "--version"
grep -q "^gpurun [0-9]" "$work/out" || fail "--version printed no version"
echo "# exit statuses 0, 3, 5, 137, 127, 126, 125 and their messages ok"
