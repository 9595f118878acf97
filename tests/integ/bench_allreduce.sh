#!/bin/bash
# The allreduce benchmark itself, small: bench/allreduce.sh with 2 ranks at 1, 4 and 16 MiB,
# one round. Its table must have a row per size, each with the ring's numbers (shared memory
# and TCP), both floors, OpenMPI's (or the reason it is skipped), the ratios, and a verdict
# against the floor only from 16 MiB (the memcpy floor paired with the ring's batches; the
# floor's own runs shown beside it without one); its heading must say what bench/handoff
# measured. bench/allreduce --floor with a kind it does not know is refused, and so is
# --paired-floor with a floor.
# timeout: 240
set -euo pipefail

# shellcheck source=prologue.sh
. "$(dirname "$0")/prologue.sh"
fail_show=(out err)
need_built gpurun rendezvousd bench/allreduce bench/handoff

if "$build/bench/allreduce" --floor sideways >"$work/usage.out" 2>&1; then
    fail "allreduce --floor sideways was accepted"
fi
grep -q '^usage: allreduce \[--floor memcpy|loopback | --paired-floor\]' "$work/usage.out" ||
    fail "allreduce --floor sideways did not print the usage: $(cat "$work/usage.out")"
if "$build/bench/allreduce" --floor memcpy --paired-floor >"$work/usage.out" 2>&1; then
    fail "allreduce --floor memcpy --paired-floor was accepted"
fi
grep -q -- '--paired-floor times the allreduce, not a floor' "$work/usage.out" ||
    fail "allreduce --floor memcpy --paired-floor: $(cat "$work/usage.out")"

BENCH_AR_WORLDS=2 BENCH_AR_MIN_BYTES=$((1 << 20)) BENCH_AR_MAX_BYTES=$((16 << 20)) \
    BENCH_AR_ROUNDS=1 timeout -k 5 200 "$root/bench/allreduce.sh" >"$work/out" 2>"$work/err" ||
    fail "allreduce.sh exited with status $?"
[ ! -s "$work/err" ] || fail "allreduce.sh complained: $(head -n 3 "$work/err")"
grep -qE '^A cache line from one CPU to another and back \(bench/handoff\): ([0-9]+ ns|unknown) before' \
    "$work/out" || fail "the heading does not say what bench/handoff measured"
num='[0-9]+\.[0-9]+'
ratio="$num"x
for size in 1 4 16; do
    row=$(grep "^| $size MiB | 2 | " "$work/out") || fail "no row for $size MiB"
    IFS='|' read -r _ _ _ ms bw mpi vs floor fvs afloor avs tbw tmpi tvs lfloor lvs _ <<<"$row"
    for v in "$ms" "$bw" "$floor" "$afloor" "$tbw" "$lfloor"; do
        [[ $v =~ ^\ $num\ $ ]] || fail "$size MiB: '$v' is not a measurement: $row"
    done
    for v in "$mpi" "$tmpi"; do
        [[ $v =~ ^\ ($num|skipped:\ .+)\ $ ]] || fail "$size MiB: OpenMPI's cell '$v': $row"
    done
    for v in "$vs" "$tvs"; do
        [[ $v =~ ^\ ($ratio\ (met|\*\*missed\*\*))?\ $ ]] || fail "$size MiB: ratio '$v': $row"
    done
    [[ $avs =~ ^\ $ratio\ $ ]] || fail "$size MiB: the floor alone's ratio is only shown: '$avs'"
    for v in "$fvs" "$lvs"; do
        if [ "$size" = 16 ]; then
            [[ $v =~ ^\ $ratio\ (met|\*\*missed\*\*)\ $ ]] ||
                fail "$size MiB: no verdict against the floor in '$v': $row"
        else
            [[ $v =~ ^\ $ratio\ $ ]] || fail "$size MiB: a floor ratio below 16 MiB is only shown: '$v'"
        fi
    done
    echo "# $row"
done
