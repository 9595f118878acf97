#!/usr/bin/env bash
# Assembles the GPU bundle (make gpu-bundle): the programs that run-gpu-checks.sh runs on a GPU
# node without build tools or Debian's packages, the shared libraries they load that such a
# node may lack, the test scripts and jobs/, in one folder that works wherever it is copied.
#
# usage: scripts/gpu-bundle.sh FLAVOUR OUT GPURUN RENDEZVOUSD TRAIN RUNNER COLL_RANK TRAIN_GPU
#   FLAVOUR   cuda (the real build) or sim (the cudasim build: the same checks on the CPU)
#   OUT       the bundle's folder, made afresh
#   the rest  the built programs, copied to OUT/bin/{gpurun,rendezvousd,gpurun-train},
#             OUT/bin/tests/{runner,coll_rank} and OUT/bin/bench/train_gpu: the layout of a
#             build folder, so that tests/run takes OUT/bin as its BUILD.
#
# Every library ldd names is copied to OUT/lib except glibc's, the C++ runtime and libgcc_s
# (every Linux has them) and CUDA's own (the driver, cudart, cuBLAS, NCCL: run-gpu-checks.sh
# finds those on the node). Programs and libraries are stripped of debug information (symbols
# stay, for backtraces; the device code's line table stays) and find OUT/lib through an
# $ORIGIN-relative RUNPATH set with patchelf, in place of the build machine's folders.
set -euo pipefail

# The bundle must travel with a working tree to a machine that takes 64 MiB in all.
MAX_MIB=${GPU_BUNDLE_MAX_MIB:-60}

die() {
    echo "gpu-bundle: $*" >&2
    exit 1
}

[ $# -eq 8 ] || die "usage: $0 FLAVOUR OUT GPURUN RENDEZVOUSD TRAIN RUNNER COLL_RANK TRAIN_GPU"
flavour=$1 out=$2
shift 2
case $flavour in
cuda | sim) ;;
*) die "flavour '$flavour': cuda or sim" ;;
esac
command -v patchelf >/dev/null || die "patchelf not found (make deps installs it)"
root=$(cd "$(dirname "$0")/.." && pwd)

# The loader's name for the folder of the file it loads (not the shell's variable).
# shellcheck disable=SC2016
origin='$ORIGIN'

# Where each program goes, in the order of the arguments.
dests=(gpurun rendezvousd gpurun-train tests/runner tests/coll_rank bench/train_gpu)

# system_lib SONAME: whether SONAME is one the bundle leaves to the node.
system_lib() {
    case $1 in
    linux-vdso.so.* | ld-linux*.so.* | libc.so.* | libm.so.* | libmvec.so.* | libpthread.so.* | \
        libdl.so.* | librt.so.* | libresolv.so.* | libutil.so.* | libanl.so.*) return 0 ;;
    libstdc++.so.* | libgcc_s.so.*) return 0 ;;
    libcuda.so.* | libcudart.so.* | libcublas.so.* | libcublasLt.so.* | libnccl.so.* | \
        libnvidia-*.so.*) return 0 ;;
    esac
    return 1
}

rm -rf "$out"
mkdir -p "$out/bin/tests" "$out/bin/bench" "$out/lib" "$out/tests/integ"
out=$(cd "$out" && pwd)

# The programs: stripped of debug sections (before patchelf, which strip can undo), then
# pointed at OUT/lib from their depth under OUT/bin.
for ((i = 0; i < ${#dests[@]}; i++)); do
    src=$1 dest=$out/bin/${dests[$i]}
    shift
    [ -x "$src" ] || die "'$src' is not built"
    cp "$src" "$dest"
    strip --strip-debug "$dest"
    case ${dests[$i]} in
    */*) rpath=$origin/../../lib ;;
    *) rpath=$origin/../lib ;;
    esac
    patchelf --set-rpath "$rpath" "$dest"
done

# The libraries: the closure ldd gives for every program (ldd resolves the libraries'
# own needs too), as found on this machine, under their sonames.
declare -A libs=()
mapfile -t progs < <(find "$out/bin" -type f | LC_ALL=C sort)
for f in "${progs[@]}"; do
    while read -r name arrow path _; do
        [ "$arrow" = "=>" ] || continue
        system_lib "$name" && continue
        [ "$path" != not ] || die "'${f#"$out"/}' needs '$name', which this machine lacks"
        libs[$name]=$path
    done < <(ldd "$f")
done
for name in "${!libs[@]}"; do
    cp -L "${libs[$name]}" "$out/lib/$name"
    chmod 0755 "$out/lib/$name"
    strip --strip-debug "$out/lib/$name"
    patchelf --set-rpath "$origin" "$out/lib/$name"
done

# What the checks run: tests/run and the integration scripts (it takes OUT/bin as BUILD),
# the jobs, run-gpu-checks.sh, the PyTorch anchor of the benchmark, and a user's DDP job.
cp "$root/tests/run" "$root/tests/seeds.sh" "$out/tests/"
cp "$root"/tests/integ/* "$out/tests/integ/"
cp -r "$root/jobs" "$out/"
cp "$root/scripts/run-gpu-checks.sh" "$out/"
cp "$root/bench/torch_gpt2.py" "$root/bench/torch_attention.py" "$out/bin/bench/"
# The user's own job: the gpurun Python package where rendezvousd looks for it beside itself
# (OUT/bin/../lib/gpurun/python: it puts it on every rank's PYTHONPATH) and a torch DDP rank.
mkdir -p "$out/lib/gpurun/python/gpurun"
cp "$root"/lib/rank/python/gpurun/*.py "$out/lib/gpurun/python/gpurun/"
cp "$root/tests/ranks/torch_ddp.py" "$out/bin/tests/"
{
    echo "flavour=$flavour"
    echo "commit=$(git -C "$root" describe --always --dirty 2>/dev/null || echo unknown)"
    echo "built=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
} >"$out/bundle.txt"

# Each program must load with OUT/lib alone (CUDA's libraries aside): ldd without the build
# machine's folders and without LD_LIBRARY_PATH.
for f in "${progs[@]}" "$out"/lib/*.so*; do
    while read -r name arrow path _; do
        [ "$arrow" = "=>" ] || continue
        system_lib "$name" && continue
        [[ $(realpath -m "$path") == "$out/lib/"* ]] ||
            die "'${f#"$out"/}' loads '$name' from '$path', not from the bundle"
    done < <(env -u LD_LIBRARY_PATH ldd "$f")
done

mib=$(du -sm "$out" | cut -f1)
[ "$mib" -le "$MAX_MIB" ] || die "'$out' is $mib MiB, over $MAX_MIB MiB"
echo "gpu-bundle: '$out' ($flavour): ${#libs[@]} libraries, $mib MiB"
