#!/usr/bin/env bash
# `make install DESTDIR=...` and `pip install lib/rank/python`: every file lands where it should
# (gpurun, rendezvousd, gr.h, libgr.a, libgr.so and the Python package under
# PREFIX/lib/gpurun/python); libgr.so exports gr.h's functions and nothing else and needs no
# library libgr.a does not (no libuv, inih, slurm); a C program built against the installed
# gr.h and libgr.so and a Python rank importing the installed package share keys in a job of
# the installed gpurun; the package that pip installs into a scratch target imports from
# there, with the version of gpurun/__init__.py (gpurun's own, client/args.h).
# timeout: 240
set -euo pipefail
# shellcheck source=local_common.sh
. "$(dirname "$0")/local_common.sh"

python=${GPURUN_PYTHON:-/usr/bin/python3}
[ -x "$python" ] || skip "no '$python'"
command -v "${CC:-cc}" >/dev/null || skip "no C compiler '${CC:-cc}'"

dest=$work/dest
prefix=/opt/gpurun
top=$dest$prefix

# --- make install ---------------------------------------------------------------------------
# The make of `make test` must not lend this one its job server; BUILD is the tree's build.
rc=0
(cd "$root" && env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make --no-print-directory \
    BUILD="$build" DESTDIR="$dest" PREFIX="$prefix" install) >"$work/out" 2>"$work/err" || rc=$?
expect_rc 0 "make install DESTDIR=$dest PREFIX=$prefix"

# want_file MODE PATH: PATH (under $top) is a file with MODE.
want_file() {
    [ -f "$top/$2" ] || fail "make install: no '$prefix/$2'"
    [ "$(mode_of "$top/$2")" = "$1" ] || fail "'$prefix/$2' has mode $(mode_of "$top/$2"), expected $1"
}
want_file 755 bin/gpurun
want_file 755 bin/rendezvousd
want_file 644 include/gr.h
want_file 644 lib/libgr.a
want_file 755 lib/libgr.so.0
[ "$(readlink "$top/lib/libgr.so")" = libgr.so.0 ] ||
    fail "lib/libgr.so is not a link to libgr.so.0: $(ls -l "$top/lib/libgr.so" 2>&1)"
for f in "$root"/lib/rank/python/gpurun/*.py; do
    want_file 644 "lib/gpurun/python/gpurun/${f##*/}"
    cmp -s "$f" "$top/lib/gpurun/python/gpurun/${f##*/}" || fail "installed ${f##*/} differs"
done
extra=$(find "$dest" -type f -o -type l | sed "s|^$top/||" | grep -vE \
    '^(bin/(gpurun|rendezvousd)|include/gr\.h|lib/libgr\.(a|so|so\.0)|lib/gpurun/python/gpurun/[a-z_]+\.py)$' ||
    true)
[ -z "$extra" ] || fail "make install put unexpected files: $extra"
echo "# make install: $(find "$dest" -type f | wc -l) files under DESTDIR$prefix"

# --- libgr.so: its exports and its needs ------------------------------------------------------
so=$top/lib/libgr.so.0
api=$(grep -oE '^(int|const char \*)[[:space:]]*gr_[a-z_]+\(' "$top/include/gr.h" |
    grep -oE 'gr_[a-z_]+' | sort)
[ "$(echo "$api" | wc -l)" -ge 10 ] || fail "found only $(echo "$api" | wc -l) functions in gr.h"
exports=$(nm -D --defined-only "$so" | awk '$2 == "T" { sub(/@.*/, "", $3); print $3 }' | sort)
[ "$exports" = "$api" ] || {
    diff <(echo "$api") <(echo "$exports") | sed 's/^/# /'
    fail "libgr.so's exported functions differ from gr.h's (< gr.h, > libgr.so)"
}
others=$(nm -D --defined-only "$so" | awk '$2 != "A" && $3 !~ /^gr_/ { print $3 }')
[ -z "$others" ] || fail "libgr.so exports symbols that are not gr.h's: $others"
needed=$(readelf -d "$so" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | paste -sd ' ')
for bad in libuv libinih libslurm libgpurun libm.so; do
    [[ " $needed" != *" $bad"* ]] || fail "libgr.so needs $bad (needed: $needed)"
done
[[ $needed == *libjansson* && $needed == *libcrypto* ]] ||
    fail "libgr.so should need jansson and libcrypto, needs: $needed"
echo "# libgr.so: exports the $(echo "$api" | wc -l) functions of gr.h; needs $needed"

# --- a C rank on the installed libgr.so, a Python rank on the installed package ---------------
# A program of its own (not a tree file: it includes only the installed header).
cat >"$work/crank.c" <<'EOF'
#include <stdio.h>
#include <string.h>
#include <gr.h>

int main(void)
{
    struct gr *g;
    char buf[64];
    size_t len = 0;

    if (gr_init(&g) < 0) {
        fprintf(stderr, "crank: %s\n", gr_strerror(NULL));
        return 1;
    }
    if (gr_kv_put(g, "from-c", "C\0side", 6) < 0 ||
        gr_kv_get(g, "from-py", buf, sizeof(buf), &len, 30000) < 0 || gr_barrier(g, NULL, 30000) < 0) {
        fprintf(stderr, "crank: %s\n", gr_strerror(g));
        return 1;
    }
    printf("c rank %d read '%.*s'\n", gr_rank(g), (int)len, buf);
    return gr_finalize(g) < 0;
}
EOF
"${CC:-cc}" -std=c11 -Wall -Wextra -Werror -I"$top/include" -o "$work/crank" "$work/crank.c" \
    -L"$top/lib" -lgr -Wl,-rpath,"$top/lib" >"$work/out" 2>"$work/err" ||
    fail "cannot build a program against the installed gr.h and libgr.so"
ldd "$work/crank" | grep -F "libgr.so.0 => $top/lib/libgr.so.0" >/dev/null ||
    fail "the program does not load the installed libgr.so: $(ldd "$work/crank" | grep libgr)"

cat >"$work/pyrank.py" <<'EOF'
import sys
import gpurun
gpurun.set("from-py", "Python side")
v = gpurun.get("from-c", timeout=30)
gpurun.barrier(timeout=30)
print("py rank %d read %r from %s" % (gpurun.rank(), v, gpurun.__file__))
EOF
# The agent names the package's folder by its real path.
top_real=$(realpath "$top")
rc=0
# shellcheck disable=SC2016 # expanded by the ranks' shell
(cd "$work" && timeout -k 5 60 "$top/bin/gpurun" --local --gpus-per-node 2 -- sh -c '
    if [ "$RANK" = 0 ]; then exec "$1"; fi
    exec "$2" -B "$3"' sh "$work/crank" "$python" "$work/pyrank.py") \
    >"$work/out" 2>"$work/err" </dev/null || rc=$?
expect_rc 0 "a job of the installed gpurun"
grep -qxF "[0] c rank 0 read 'Python side'" "$work/out" || fail "the C rank did not read the Python key"
grep -qxF "[1] py rank 1 read b'C\\x00side' from $top_real/lib/gpurun/python/gpurun/__init__.py" \
    "$work/out" || fail "the Python rank did not read the C key from the installed package"
echo "# installed gpurun: a C rank on libgr.so and a Python rank on the installed package"

# --- pip install lib/rank/python into a scratch target ---------------------------------------------
"$python" -m pip --version >/dev/null 2>&1 || skip "'$python -m pip' does not run (python3-pip)"
# From a copy: pip builds in the source folder, and the tree stays clean. No index, no build
# isolation: Debian's setuptools builds it offline.
cp -r "$root/lib/rank/python" "$work/src"
rm -rf "$work/src/build" "$work/src"/*.egg-info
rc=0
t0=$(date +%s%N)
"$python" -m pip install --quiet --no-index --no-build-isolation --no-deps \
    --target "$work/site" "$work/src" >"$work/out" 2>"$work/err" || rc=$?
expect_rc 0 "pip install --target of lib/rank/python"
echo "# pip install: $((($(date +%s%N) - t0) / 1000000)) ms"
got=$(cd "$work" && env -u PYTHONPATH -u GPURUN_SOCK PYTHONPATH="$work/site" "$python" -B -c '
import importlib.metadata as md, gpurun, gpurun.lightning, gpurun.hf
print(gpurun.__file__, gpurun.__version__, md.version("gpurun"), gpurun.rank(), gpurun.get("k"))')
c_version=$(sed -n 's/^#define GPURUN_VERSION "\(.*\)"$/\1/p' "$root/client/args.h")
v=$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' "$root/lib/rank/python/gpurun/__init__.py")
[ -n "$v" ] || fail "no __version__ line in lib/rank/python/gpurun/__init__.py"
want="$work/site/gpurun/__init__.py $v $v 0 None"
[ "$got" = "$want" ] || fail "import gpurun from the pip target: got '$got', expected '$want'"
[ "$v" = "$c_version" ] || fail "the Python package is version $v, gpurun (client/args.h) $c_version"
echo "# pip install --target: import gpurun $v from the target, metadata agrees"
