#!/usr/bin/env bash
# Makes the demo's byte-level token shards (train_000000.bin, val_000000.bin) unless they are
# there already. The text is what every Debian 12 system has, from two Essential packages:
# the GNU coreutils manual (coreutils: /usr/share/info/coreutils.info.gz, ~970 KB of English
# prose) followed by the licence texts of base-files (/usr/share/common-licenses, ~300 KB).
# The licences come last so that the validation part (the last 5%) is prose of the same kind
# as the training text, not the manual's index.
#
# usage: scripts/prep-demo-data.sh [OUT_DIR]   (default: $BUILD/data/demo)
# Environment: BUILD (the build dir, default build), DEMO_INFO (the manual to use), DEMO_LICENSES
# (the licence directory).
set -euo pipefail

cd "$(dirname "$0")/.."
build=${BUILD:-build}
out=${1:-$build/data/demo}
info=${DEMO_INFO:-/usr/share/info/coreutils.info.gz}
licenses=${DEMO_LICENSES:-/usr/share/common-licenses}

if [ -s "$out/train_000000.bin" ] && [ -s "$out/val_000000.bin" ]; then
    exit 0
fi
if [ ! -x "$build/gpurun-train" ]; then
    echo "prep-demo-data: '$build/gpurun-train' is not built; run 'make' first" >&2
    exit 1
fi
if [ ! -r "$info" ]; then
    echo "prep-demo-data: '$info' is missing (package coreutils)" >&2
    exit 1
fi

src=$(mktemp -d "${TMPDIR:-/tmp}/gpurun-demo-text.XXXXXX")
trap 'rm -rf "$src"' EXIT
gzip -dc "$info" >"$src/manual.txt"
texts=("$src/manual.txt")
# Regular files only (GPL, LGPL and GFDL are links to a version also listed), in a fixed
# order so that every machine makes the same shards.
while IFS= read -r f; do
    texts+=("$f")
done < <(find "$licenses" -maxdepth 1 -type f | LC_ALL=C sort)

"$build/gpurun-train" prep "${texts[@]}" -o "$out"
