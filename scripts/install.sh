#!/usr/bin/env bash
# make install and make uninstall: the files of an installed gpurun, one row each, put under
# DESTDIR/PREFIX or taken away again. Install records each directory it had to make in
# PREFIX/lib/gpurun/installed-dirs, so that uninstall removes those (when empty) and no other.
#
# usage: scripts/install.sh install|uninstall
# Environment (the Makefile's): PREFIX (absolute), DESTDIR (may be empty), BUILD (the build dir,
# for install), GR_VERSION (gr.pc's Version), GR_LIBS_PRIVATE (what a static link of libgr.a
# needs besides it: gr.pc's Libs.private).
set -euo pipefail

cd "$(dirname "$0")/.."
mode=${1:-}
prefix=${PREFIX:?PREFIX is not set}
destdir=${DESTDIR:-}
build=${BUILD:-build}
[[ $prefix == /* ]] || {
    echo "install: PREFIX '$prefix' is not an absolute path" >&2
    exit 1
}
top=$destdir$prefix
record=lib/gpurun/installed-dirs

# The installed files: MODE SOURCE TARGET (TARGET under PREFIX). MODE "link" makes TARGET a
# symbolic link to SOURCE; "pc" writes TARGET from the template SOURCE.
rows=(
    "755 $build/gpurun bin/gpurun"
    "755 $build/rendezvousd bin/rendezvousd"
    "755 $build/gpurun-shim libexec/gpurun/gpurun-shim"
    "755 $build/gpurun-train bin/gpurun-train"
    "644 $build/libgr.a lib/libgr.a"
    "755 $build/libgr.so.1 lib/libgr.so.1"
    "link libgr.so.1 lib/libgr.so"
    "644 lib/rank/gr.h include/gr.h"
    "pc lib/rank/gr.pc.in lib/pkgconfig/gr.pc"
    "644 docs/man/gpurun.1 share/man/man1/gpurun.1"
    "644 docs/man/gpurun-train.1 share/man/man1/gpurun-train.1"
    "644 docs/man/gr.3 share/man/man3/gr.3"
    "644 docs/man/rendezvousd.8 share/man/man8/rendezvousd.8"
    "644 client/completion.bash share/bash-completion/completions/gpurun"
)
# The gpurun Python package, where rendezvousd finds it (PREFIX/bin/../lib/gpurun/python).
for f in lib/rank/python/gpurun/*.py; do
    rows+=("644 $f lib/gpurun/python/gpurun/${f##*/}")
done

# make_dir DIR: makes DIR (under PREFIX) and each missing parent, recording each one made.
make_dir() {
    local d=$top/$1 missing=()
    while [ ! -d "$d" ] && [ "$d" != "$destdir" ] && [ "$d" != / ]; do
        missing=("$d" "${missing[@]}")
        d=$(dirname "$d")
    done
    for d in "${missing[@]}"; do
        mkdir -m 755 "$d"
        made+=("${d#"$destdir"}")
    done
}

# write_pc TEMPLATE TARGET: the template with @PREFIX@, @VERSION@ and @LIBS_PRIVATE@ filled in.
write_pc() {
    local line
    while IFS= read -r line; do
        line=${line//@PREFIX@/$prefix}
        line=${line//@VERSION@/${GR_VERSION:?GR_VERSION is not set}}
        line=${line//@LIBS_PRIVATE@/${GR_LIBS_PRIVATE:-}}
        printf '%s\n' "$line"
    done <"$1" >"$2.tmp"
    chmod 644 "$2.tmp"
    mv -f "$2.tmp" "$2"
}

do_install() {
    local row m src dst
    made=()
    for row in "${rows[@]}"; do
        read -r m src dst <<<"$row"
        [ "$m" = link ] || [ -f "$src" ] || {
            echo "install: '$src' is missing (run make first)" >&2
            exit 1
        }
    done
    [ -z "$destdir" ] || mkdir -p "$destdir"
    make_dir lib/gpurun
    for row in "${rows[@]}"; do
        read -r m src dst <<<"$row"
        make_dir "$(dirname "$dst")"
        case $m in
        link) ln -sfn "$src" "$top/$dst" ;;
        pc) write_pc "$src" "$top/$dst" ;;
        *) install -m "$m" "$src" "$top/$dst" ;;
        esac
    done
    # Appended: a second install over the first makes nothing, and the first's record stays.
    if [ ${#made[@]} -gt 0 ]; then
        printf '%s\n' "${made[@]}" >>"$top/$record"
    fi
    touch "$top/$record"
    chmod 644 "$top/$record"
    echo "installed gpurun under '$top'"
}

do_uninstall() {
    local row m src dst d dirs=()
    for row in "${rows[@]}"; do
        read -r m src dst <<<"$row"
        rm -f "$top/$dst"
    done
    # What Python wrote beside the installed package when a rank imported it.
    rm -rf "$top/lib/gpurun/python/gpurun/__pycache__"
    if [ -f "$top/$record" ]; then
        while IFS= read -r d; do
            [ -n "$d" ] && dirs+=("$d")
        done <"$top/$record"
        rm -f "$top/$record"
    fi
    # Deepest first: a directory sorts after its parent.
    if [ ${#dirs[@]} -gt 0 ]; then
        while IFS= read -r d; do
            rmdir "$destdir$d" 2>/dev/null || true
        done < <(printf '%s\n' "${dirs[@]}" | LC_ALL=C sort -ru)
    fi
    echo "uninstalled gpurun from '$top'"
}

case $mode in
install) do_install ;;
uninstall) do_uninstall ;;
*)
    echo "usage: scripts/install.sh install|uninstall" >&2
    exit 2
    ;;
esac
