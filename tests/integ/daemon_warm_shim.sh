#!/usr/bin/env bash
# Warm shims (daemon/shim.h): the agent starts each local rank's shim while its node joins,
# and hands it the rank's arguments and environment down a pipe at the assign. The shim run
# by hand reads its spec whole (an empty argument, spaces, a newline in a value), exits 0
# having started nothing when the pipe ends empty, and 125 naming the fd on a spec it cannot
# read, and a command that ends in those words still runs. In a job every rank runs under a
# warm shim with its own environment; a warm shim killed before the assign is replaced by a
# rank spawned anew, the job completing; a node that ends before its assign (pre-flight
# failed) leaves no shim behind.
# timeout: 90
set -euo pipefail

# shellcheck source=prologue.sh
. "$(dirname "$0")/prologue.sh"
fail_show=('*.err' '*.out')
need_built gpurun rendezvousd gpurun-shim
rdv=$build/rendezvousd
shim=$build/gpurun-shim

# --- the shim by hand ---------------------------------------------------------------------
# spec ARG... :: ENV...: the spec text (counts and words, NUL-ended) on stdout.
spec() {
    local args=() envs=()
    while [ "$1" != :: ]; do
        args+=("$1")
        shift
    done
    shift
    envs=("$@")
    printf '%s\0' "${#args[@]}" "${args[@]}" "${#envs[@]}" "${envs[@]}"
}
# shellcheck disable=SC2016 # expanded by the rank's shell
spec -- sh -c 'printf "[%s][%s][%s]\n" "$0" "$1" "$FOO"' 'a b' '' :: "FOO=x
y" PATH=/usr/bin:/bin >"$work/spec"
"$shim" --exec-rank $$ --alive-ms 0 --spec-fd 4 4<"$work/spec" >"$work/hand.out" 2>"$work/hand.err" ||
    fail "the shim with a spec exited $?: $(cat "$work/hand.err")"
want="[a b][][x
y]"
[ "$(cat "$work/hand.out")" = "$want" ] ||
    fail "the shim's rank printed '$(cat "$work/hand.out")', want '$want'"

st=0
"$shim" --exec-rank $$ --alive-ms 0 --spec-fd 4 4</dev/null >"$work/empty.out" 2>&1 || st=$?
{ [ "$st" = 0 ] && [ ! -s "$work/empty.out" ]; } ||
    fail "an empty spec: status $st, output '$(cat "$work/empty.out")' (want 0 and none)"

for bad in '2\0--\0' '1\0--\0x\0' 'x\0' '1\0--\0' '0\0' '0\0''0\0extra\0'; do
    # shellcheck disable=SC2059 # the format is the spec, its \0 the NULs
    printf "$bad" >"$work/bad"
    st=0
    "$shim" --exec-rank $$ --alive-ms 0 --spec-fd 4 4<"$work/bad" >"$work/bad.out" 2>&1 || st=$?
    { [ "$st" = 125 ] && grep -q "could not read its rank's arguments from its agent (fd 4)" \
        "$work/bad.out"; } || fail "spec '$bad': status $st, '$(cat "$work/bad.out")' (want 125)"
done

# A shim started with its rank's words (no spec) whose command ends in the same two words runs
# the command.
"$shim" --exec-rank $$ --alive-ms 0 -- echo hi --spec-fd 0 </dev/null >"$work/cmd.out" 2>&1 ||
    fail "a command ending in '--spec-fd 0': status $?, '$(cat "$work/cmd.out")'"
[ "$(cat "$work/cmd.out")" = "hi --spec-fd 0" ] ||
    fail "a command ending in '--spec-fd 0' printed '$(cat "$work/cmd.out")'"

# --- in a job ------------------------------------------------------------------------------
# Every rank's shim is a warm one, and each rank has its own environment and arguments.
# shellcheck disable=SC2016 # expanded by the ranks' shell
"$build/gpurun" --local -n 3 -- sh -c \
    'echo "$RANK $LOCAL_RANK $1 $(tr "\0" " " <"/proc/$PPID/cmdline" | grep -o -- "--spec-fd [0-9]*")"' \
    arg0 "x y" >"$work/job.out" 2>"$work/job.err" || fail "the job failed"
got=$(sed 's/^\[[0-9]\] //' "$work/job.out" | sort)
want="0 0 x y --spec-fd 4
1 1 x y --spec-fd 4
2 2 x y --spec-fd 4"
[ "$got" = "$want" ] || fail "the ranks said '$got', want '$want'"

# job NAME NNODES GPUS: a job dir for NNODES nodes of one rank each and GPUS GPUs a node, its
# ranks printing their rank and their shim's pid.
job() {
    dir=$work/$1
    mkdir -m 0700 "$dir"
    head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$dir/key"
    echo >>"$dir/key"
    chmod 600 "$dir/key"
    cat >"$dir/job.json" <<JSON
{"version": 1, "job_id": "warm-$1", "nnodes": $2, "nprocs": 1, "loopback": true,
 "gpus_per_node": $3, "kill_grace_ms": 500, "join_timeout_ms": 20000,
 "argv": ["sh", "-c", "echo \"rank \$RANK shim \$PPID\""]}
JSON
}

# warm_of PID: the pid of the warm shim daemon PID started, waiting up to 5 s.
warm_of() {
    local p
    for _ in $(seq 100); do
        p=$(pgrep -P "$1" -f -- '--spec-fd' | head -n 1) || true
        [ -n "$p" ] && {
            echo "$p"
            return
        }
        sleep 0.05
    done
    fail "daemon $1 started no warm shim"
}

# A warm shim killed before the assign: the rank is spawned anew.
job killed 2 0
"$rdv" --job-dir "$dir" --node-rank 0 >"$work/killed-n0.out" 2>"$work/killed-n0.err" &
n0=$!
bg_pids+=("$n0")
w=$(warm_of "$n0")
kill -KILL "$w"
"$rdv" --job-dir "$dir" --node-rank 1 >"$work/killed-n1.out" 2>"$work/killed-n1.err" || true
st=0
wait "$n0" || st=$?
bg_pids=()
[ "$st" = 0 ] || fail "node 0 exited $st after its warm shim was killed"
grep -q "^\[0\] rank 0 shim [0-9]*$" "$work/killed-n0.out" ||
    fail "rank 0 did not run: $(cat "$work/killed-n0.out")"
grep -q "^\[0\] rank 0 shim $w$" "$work/killed-n0.out" &&
    fail "rank 0 ran under the killed shim $w"
grep -q "warm shim of local rank 0 ended by signal 9 before its rank" "$work/killed-n0.err" ||
    fail "node 0 did not say its warm shim was killed: $(tail -n 5 "$work/killed-n0.err")"

# A node whose pre-flight fails ends before any assign: its warm shim goes with it.
job fenced 2 2
CUDA_VISIBLE_DEVICES=0,1 "$rdv" --job-dir "$dir" --node-rank 0 \
    >"$work/fenced-n0.out" 2>"$work/fenced-n0.err" &
n0=$!
bg_pids+=("$n0")
w=$(warm_of "$n0")
st=0
CUDA_VISIBLE_DEVICES=0 timeout 20 "$rdv" --job-dir "$dir" --node-rank 1 \
    >"$work/fenced-n1.out" 2>"$work/fenced-n1.err" || st=$?
[ "$st" = 125 ] || fail "node 1, short of GPUs, exited $st (want 125)"
st=0
timeout 20 tail --pid "$n0" -f /dev/null || fail "node 0 did not end after node 1's pre-flight"
wait "$n0" || st=$?
bg_pids=()
[ "$st" = 125 ] || fail "node 0 exited $st (want 125)"
grep -q "^\[" "$work/fenced-n0.out" && fail "a rank ran: $(cat "$work/fenced-n0.out")"
kill -0 "$w" 2>/dev/null && fail "node 0's warm shim $w outlived it"
echo "# warm shims: the spec by hand, 3 local ranks, one killed before its assign, one job fenced"
