#!/usr/bin/env bash
# tests/seeds.sh RUNNER N FILTER...: the unit tests that RUNNER (a tests/runner build) selects
# with FILTER, once per seed 1..N (GPURUN_TEST_SEED: the CUDA tests' random inputs), to show
# that their tolerances hold for inputs other than make test's fixed seed. Prints a line per
# seed ("seed S: T passed" or "seed S: failed NAME, NAME"), then one per test that failed any
# seed, then "seeds 1..N: T tests x N seeds, F of R runs failed" last. Exit status 0 when none
# failed. The environment passes through (CUDASIM_SCHEDULE and the like for the cudasim
# runner); SEEDS_TIMEOUT_FACTOR is the runner's --timeout-factor (default 1); SEEDS_DEADLINE_S
# stops starting seeds after that many seconds (the last line then says how many ran).
set -euo pipefail

[ $# -ge 3 ] || {
    echo "usage: tests/seeds.sh RUNNER N FILTER..." >&2
    exit 2
}
runner=$1 n=$2
shift 2
[ -x "$runner" ] || {
    echo "tests/seeds.sh: '$runner' is not a built test runner" >&2
    exit 2
}
[[ $n =~ ^[1-9][0-9]*$ ]] || {
    echo "tests/seeds.sh: N '$n' must be a positive number" >&2
    exit 2
}

tap=$(mktemp "${TMPDIR:-/tmp}/gpurun-seeds.XXXXXX")
trap 'rm -f "$tap"' EXIT
declare -A failed_by=()
runs=0 bad=0 tests=0
for ((s = 1; s <= n; s++)); do
    rc=0
    GPURUN_TEST_SEED=$s "$runner" --tap-only --timeout-factor "${SEEDS_TIMEOUT_FACTOR:-1}" "$@" \
        >"$tap" 2>/dev/null || rc=$?
    ran=$(grep -cE '^(not )?ok ' "$tap" || true)
    fails=$(sed -n 's/^not ok [0-9]* - //p' "$tap")
    if [ "$ran" = 0 ]; then
        echo "seed $s: the runner ran no test (exit $rc)"
        bad=$((bad + 1))
        continue
    fi
    tests=$ran runs=$((runs + ran))
    if [ -n "$fails" ]; then
        echo "seed $s: failed $(paste -sd, <<<"$fails" | sed 's/,/, /g')"
        while IFS= read -r t; do
            failed_by[$t]="${failed_by[$t]:-}${failed_by[$t]:+ }$s"
            bad=$((bad + 1))
        done <<<"$fails"
    elif [ "$rc" != 0 ]; then
        echo "seed $s: the runner exited $rc with no test failed"
        bad=$((bad + 1))
    else
        echo "seed $s: $ran passed"
    fi
    if [ -n "${SEEDS_DEADLINE_S:-}" ] && [ "$SECONDS" -ge "$SEEDS_DEADLINE_S" ] && [ "$s" -lt "$n" ]; then
        echo "seeds: stopped after seed $s of $n (SEEDS_DEADLINE_S=$SEEDS_DEADLINE_S)"
        n=$s
    fi
done
for t in "${!failed_by[@]}"; do
    echo "$t: failed with seeds ${failed_by[$t]}"
done
echo "seeds 1..$n: $tests tests x $n seeds, $bad of $runs runs failed"
[ "$bad" = 0 ]
