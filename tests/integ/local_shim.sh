#!/usr/bin/env bash
# Each rank starts under the rank shim: gpurun-shim beside rendezvousd (a program of libc
# alone, the fast start), and rendezvousd itself (--exec-rank) where there is none beside it.
# timeout: 60
set -euo pipefail

# shellcheck source=prologue.sh
. "$(dirname "$0")/prologue.sh"
need_built --hint "make all" gpurun rendezvousd gpurun-shim

# ranks_shims GPURUN: each rank's line "RANK SHIM-PROGRAM SHIM-ARGV1" (GPURUN runs the
# rendezvousd beside it).
ranks_shims() {
    # shellcheck disable=SC2016 # expanded by the ranks' shell
    "$1" --local -n 2 -- sh -c \
        'echo "$RANK $(readlink "/proc/$PPID/exe") $(tr "\0" " " <"/proc/$PPID/cmdline" | cut -d" " -f2)"' \
        2>"$work/err" | sed 's/^\[[0-9]\] //' | sort
}

got=$(ranks_shims "$build/gpurun")
want="0 $(realpath "$build/gpurun-shim") --exec-rank
1 $(realpath "$build/gpurun-shim") --exec-rank"
[ "$got" = "$want" ] || fail "the ranks' shims: got '$got', want '$want'"
ldd "$build/gpurun-shim" | grep -qE 'libcrypto|libuv|libjansson' &&
    fail "gpurun-shim links more than libc: $(ldd "$build/gpurun-shim")"
# rendezvousd has libuv, jansson and libcrypto in it where their static archives are
# installed (Makefile, RDV_STATIC_A): none of the three is loaded at its start.
archives=0
for a in libuv_a.a libjansson.a libcrypto.a; do
    [[ $(${CC:-cc} -print-file-name=$a) == /* ]] && archives=$((archives + 1))
done
if [ "$archives" = 3 ]; then
    ldd "$build/rendezvousd" | grep -E 'libcrypto|libuv|libjansson' &&
        fail "rendezvousd loads shared libraries it has in it: $(ldd "$build/rendezvousd")"
else
    echo "# rendezvousd links the shared libuv, jansson, libcrypto: $archives of 3 archives here"
fi

mkdir "$work/alone"
cp "$build/gpurun" "$build/rendezvousd" "$work/alone/"
got=$(ranks_shims "$work/alone/gpurun")
want="0 $work/alone/rendezvousd --exec-rank
1 $work/alone/rendezvousd --exec-rank"
[ "$got" = "$want" ] || fail "without gpurun-shim beside it: got '$got', want '$want'"
echo "ranks run under gpurun-shim beside rendezvousd, and under rendezvousd --exec-rank without it"
