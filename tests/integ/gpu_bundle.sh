#!/usr/bin/env bash
# The GPU bundle (make gpu-bundle: scripts/gpu-bundle.sh and scripts/run-gpu-checks.sh) in its
# sim flavour, as a GPU node would get it: made into a scratch folder by make, copied elsewhere
# and the original removed, then used with `env -i` (a minimal PATH, no LD_LIBRARY_PATH).
# Every program and library of the copy loads what it needs from the copy's lib/ alone, glibc,
# the C++ runtime and libgcc_s aside; run-gpu-checks.sh runs every step with a shorter test
# list and training run than on a GPU, exits 0, and its report.md says that each check passed
# (the PyTorch anchor and the kernel profile, which need a GPU, skip with their reasons). A
# step left no time of the total is a timeout, and fails the run. The seeds step, run only when
# asked for, sweeps the randomized CUDA tests over two seeds.
# timeout: 240
# lane: side
set -euo pipefail

# shellcheck source=prologue.sh
. "$(dirname "$0")/prologue.sh"
fail_show=(make.out checks.out out/report.md)

cd "$root"
need_built --hint "make sim; it needs the CUDA toolkit's headers" sim/gpurun-train
command -v patchelf >/dev/null || skip "patchelf is not installed (scripts/deps.sh installs it)"

# make, outside any make that runs the tests (its jobserver is not this one's).
env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make --no-print-directory BUILD="$build" gpu-bundle \
    GPU_BUNDLE_FLAVOUR=sim GPU_BUNDLE_DIR="$work/made" >"$work/make.out" 2>&1 ||
    fail "make gpu-bundle GPU_BUNDLE_FLAVOUR=sim failed"
grep '^gpu-bundle: ' "$work/make.out" | sed 's/^/# /'
cp -r "$work/made" "$work/copy"
rm -rf "$work/made"
copy=$work/copy
grep -qx 'flavour=sim' "$copy/bundle.txt" || fail "bundle.txt: $(cat "$copy/bundle.txt")"
for p in gpurun rendezvousd gpurun-train tests/runner tests/coll_rank bench/train_gpu; do
    [ -x "$copy/bin/$p" ] || fail "the bundle has no bin/$p"
done
for p in run-gpu-checks.sh tests/run tests/seeds.sh tests/integ/train_cuda_common.sh jobs/gpt2-124m.cfg \
    lib/gpurun/python/gpurun/__init__.py bin/tests/torch_ddp.py; do
    [ -f "$copy/$p" ] || fail "the bundle has no $p"
done
mib=$(du -sm "$copy" | cut -f1)
[ "$mib" -lt 60 ] || fail "the bundle is $mib MiB, over 60"

# Where each ELF file of the copy finds its libraries, with nothing on the loader's path.
n=0
while IFS= read -r f; do
    head -c 4 "$f" | grep -q 'ELF' || continue
    n=$((n + 1))
    env -i PATH=/usr/bin:/bin ldd "$f" >"$work/ldd" 2>&1 || fail "ldd '$f': $(cat "$work/ldd")"
    while read -r name arrow path _; do
        [ "$arrow" = "=>" ] || continue
        case $name in
        libc.so.* | libm.so.* | libpthread.so.* | libdl.so.* | librt.so.* | libresolv.so.* | \
            libstdc++.so.* | libgcc_s.so.*) continue ;;
        esac
        [ "$path" != not ] || fail "'${f#"$copy"/}' needs '$name', which is not found"
        [[ $(realpath "$path") == "$copy/lib/"* ]] ||
            fail "'${f#"$copy"/}' loads '$name' from '$path', outside the bundle"
    done <"$work/ldd"
done < <(find "$copy/bin" "$copy/lib" -type f)
[ "$n" -ge 6 ] || fail "only $n ELF files in the bundle"
echo "# $n programs and libraries load from the bundle alone ($mib MiB)"

# A user's rank under the bundle's gpurun imports the gpurun package the bundle carries (not
# this checkout's), and its report reaches the record.
if [ -x /usr/bin/python3 ]; then
    rc=0
    (cd "$work" && env -i PATH=/usr/bin:/bin HOME="$work" "$copy/bin/gpurun" --local \
        --job-dir "$work/pyjob" -- /usr/bin/python3 -c \
        'import gpurun; print(gpurun.__file__); gpurun.report(7, loss=1.5)') \
        >"$work/pyjob.out" 2>&1 || rc=$?
    [ "$rc" = 0 ] || fail "a Python rank under the bundle's gpurun exited $rc: $(tail -n 3 "$work/pyjob.out")"
    grep -qF "[0] $copy/lib/gpurun/python/gpurun/__init__.py" "$work/pyjob.out" ||
        fail "the rank did not import the bundle's package: $(grep '^\[0\]' "$work/pyjob.out")"
    got=$(/usr/bin/python3 -c 'import json, sys; r = json.load(open(sys.argv[1]))["ranks"][0]
print(r["reported"], r["step"])' "$work/pyjob/summary.json")
    [ "$got" = "True 7" ] || fail "the rank's report under the bundle's gpurun: $got"
    echo "# a Python rank under the bundle's gpurun imports its package and reports"
fi

# The checks, from elsewhere, in a bare environment, on a shorter schedule than a GPU's.
rc=0
(cd "$work" && env -i PATH=/usr/bin:/bin HOME="$work" GPU_CHECKS_TESTS="cuda_ops train_cuda_resume" \
    GPU_CHECKS_STEPS=100 GPU_CHECKS_CMP_STEPS=6 GPU_CHECKS_TEXT_MB=1 GPU_CHECKS_TOTAL=200 \
    "$copy/run-gpu-checks.sh" out) >"$work/checks.out" 2>&1 || rc=$?
[ "$rc" = 0 ] || fail "run-gpu-checks.sh exited $rc"
report=$work/out/report.md
[ -s "$report" ] || fail "no report.md"
grep -q '^# GPU checks (sim flavour)$' "$report" || fail "report.md does not name the sim flavour"
grep -q '^- CUDA libraries: none needed (the sim flavour)$' "$report" ||
    fail "report.md does not say which CUDA libraries it used"
for check in tests bench train "NCCL, world size 1" train.zero=1 resume memcheck racecheck; do
    grep -qF "| $check | pass | " "$report" || fail "report.md: '$check' did not pass"
done
grep -q '^| kernels | skip | .*no hardware counters' "$report" ||
    fail "report.md: the kernels step did not skip under cudasim with its reason"
grep -q '^| ddp | skip | .*no DDP job under cudasim' "$report" ||
    fail "report.md: the DDP job did not skip under cudasim with its reason"
grep -q '^| anchor | skip | .*no anchor under cudasim' "$report" ||
    fail "report.md: the PyTorch anchor did not skip under cudasim with its reason"
grep -qE '^\| train \| pass \| .*: loss [0-9.]+ -> [0-9.]+ ' "$report" || fail "the train row has no losses"
for f in env.txt tests.log bench.log train.log compare.log memcheck.log racecheck.log; do
    [ -s "$work/out/$f" ] || fail "OUTDIR has no $f"
done
! grep -q '^| seeds |' "$report" || fail "report.md: the seeds step ran without GPU_CHECKS_ONLY"
sed -n 's/^| \([^|]*\) | pass | \([0-9]* s\) | .*/# ok: \1 (\2)/p' "$report"
tail -n 1 "$report" | sed 's/^/# /'

# A step that finds no time left of the total did not run: a timeout row, and the run fails.
rc=0
(cd "$work" && env -i PATH=/usr/bin:/bin HOME="$work" GPU_CHECKS_ONLY=bench GPU_CHECKS_TOTAL=0 \
    "$copy/run-gpu-checks.sh" late) >"$work/late.out" 2>&1 || rc=$?
[ "$rc" = 1 ] || fail "run-gpu-checks.sh with no time left exited $rc, not 1"
grep -q '^| bench | timeout | 0 s | not run: no time left of GPU_CHECKS_TOTAL=0 s |$' \
    "$work/late/report.md" || fail "no timeout row for a step with no time left"

# The seed sweep, asked for by name: the randomized CUDA tests once per seed.
rc=0
(cd "$work" && env -i PATH=/usr/bin:/bin HOME="$work" GPU_CHECKS_ONLY=seeds GPU_CHECKS_SEEDS=2 \
    "$copy/run-gpu-checks.sh" seeds) >"$work/seeds.out" 2>&1 || rc=$?
[ "$rc" = 0 ] || fail "run-gpu-checks.sh's seeds step exited $rc: $(tail -n 5 "$work/seeds.out")"
grep -qE '^\| seeds \| pass \| [0-9]+ s \| seeds 1\.\.2: [0-9]+ tests x 2 seeds, 0 of [0-9]+ runs failed \|$' \
    "$work/seeds/report.md" || fail "no seeds row: $(grep '^| seeds' "$work/seeds/report.md")"
grep '^| seeds |' "$work/seeds/report.md" | sed 's/^/# /'
