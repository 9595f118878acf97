#!/usr/bin/env bash
# `make install DESTDIR=... PREFIX=...`, `make uninstall` and `pip install lib/rank/python`:
# every file lands where it should with its mode (gpurun, rendezvousd, gpurun-train, gr.h,
# libgr.a, libgr.so, gr.pc, the man pages, bash's completion, the Python package under
# PREFIX/lib/gpurun/python); libgr.so exports gr.h's functions and nothing else, all of the
# version node its soname numbers (libgr.so.1: LIBGR_1), and needs no library libgr.a does not
# (no libuv, inih, slurm); the man pages are lint-clean (groff -ww) and name the options of
# their program's help, no more, no fewer (gr(3): gr.h's functions); the completion, sourced in
# bash, completes subcommands, options and their values, and job ids from the jobs root; `gpurun
# help`; a C program built with the installed gr.pc (gr(3)'s example) and a Python rank on the
# installed package in jobs of the installed gpurun; a training job run from an empty dir with
# nothing of the checkout on PATH; `make uninstall` leaves no file and none of the directories
# install made; the package that pip installs into a scratch target imports from there, with the
# version of gpurun/__init__.py (gpurun's own, client/version.h).
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
want_file 755 libexec/gpurun/gpurun-shim
want_file 755 bin/gpurun-train
want_file 644 include/gr.h
want_file 644 lib/libgr.a
want_file 755 lib/libgr.so.1
[ "$(readlink "$top/lib/libgr.so")" = libgr.so.1 ] ||
    fail "lib/libgr.so is not a link to libgr.so.1: $(ls -l "$top/lib/libgr.so" 2>&1)"
want_file 644 lib/pkgconfig/gr.pc
mans=(man1/gpurun.1 man1/gpurun-train.1 man3/gr.3 man8/rendezvousd.8)
for m in "${mans[@]}"; do
    want_file 644 "share/man/$m"
    cmp -s "$root/docs/man/${m#*/}" "$top/share/man/$m" || fail "installed $m differs"
done
want_file 644 share/bash-completion/completions/gpurun
want_file 644 lib/gpurun/installed-dirs
for f in "$root"/lib/rank/python/gpurun/*.py; do
    want_file 644 "lib/gpurun/python/gpurun/${f##*/}"
    cmp -s "$f" "$top/lib/gpurun/python/gpurun/${f##*/}" || fail "installed ${f##*/} differs"
done
extra=$(find "$dest" -type f -o -type l | sed "s|^$top/||" | grep -vE \
    '^(bin/(gpurun|rendezvousd|gpurun-train)|libexec/gpurun/gpurun-shim|include/gr\.h|lib/libgr\.(a|so|so\.1)|lib/pkgconfig/gr\.pc|share/man/man(1/gpurun(-train)?\.1|3/gr\.3|8/rendezvousd\.8)|share/bash-completion/completions/gpurun|lib/gpurun/installed-dirs|lib/gpurun/python/gpurun/[a-z_]+\.py)$' ||
    true)
[ -z "$extra" ] || fail "make install put unexpected files: $extra"
echo "# make install: $(find "$dest" -type f | wc -l) files under DESTDIR$prefix"

# --- libgr.so: its exports and its needs ------------------------------------------------------
so=$top/lib/libgr.so.1
api=$(grep -oE '^(int|const char \*)[[:space:]]*gr_[a-z_]+\(' "$top/include/gr.h" |
    grep -oE 'gr_[a-z_]+' | sort)
[ "$(echo "$api" | wc -l)" -ge 10 ] || fail "found only $(echo "$api" | wc -l) functions in gr.h"
exports=$(nm -D --defined-only "$so" | awk '$2 == "T" { sub(/@.*/, "", $3); print $3 }' | sort)
[ "$exports" = "$api" ] || {
    diff <(echo "$api") <(echo "$exports") | sed 's/^/# /'
    fail "libgr.so's exported functions differ from gr.h's (< gr.h, > libgr.so)"
}
# The soname's number and the version node of every export are the same ABI (the Makefile's
# GR_SONAME, lib/rank/libgr.map).
soname=$(readelf -d "$so" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[ "$soname" = libgr.so.1 ] || fail "libgr.so.1's soname is '$soname'"
nodes=$(nm -D --defined-only "$so" | awk '$2 == "T" { sub(/^[^@]*@@?/, "", $3); print $3 }' |
    sort -u | paste -sd ' ')
[ "$nodes" = "LIBGR_${soname##*.}" ] ||
    fail "libgr.so.1 exports functions of version nodes '$nodes', not LIBGR_${soname##*.} alone"
others=$(nm -D --defined-only "$so" | awk '$2 != "A" && $3 !~ /^gr_/ { print $3 }')
[ -z "$others" ] || fail "libgr.so exports symbols that are not gr.h's: $others"
needed=$(readelf -d "$so" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | paste -sd ' ')
for bad in libuv libinih libslurm libgpurun libm.so; do
    [[ " $needed" != *" $bad"* ]] || fail "libgr.so needs $bad (needed: $needed)"
done
[[ $needed == *libjansson* && $needed == *libcrypto* ]] ||
    fail "libgr.so should need jansson and libcrypto, needs: $needed"
echo "# libgr.so: exports the $(echo "$api" | wc -l) functions of gr.h; needs $needed"

# --- gpurun help ----------------------------------------------------------------------------
"$top/bin/gpurun" --help >"$work/help.want"
"$top/bin/gpurun" help >"$work/out" 2>"$work/err" || fail "'gpurun help' failed: $(cat "$work/err")"
cmp -s "$work/out" "$work/help.want" || fail "'gpurun help' differs from 'gpurun --help'"
"$top/bin/gpurun" status --help >"$work/help.want"
"$top/bin/gpurun" help status >"$work/out" || fail "'gpurun help status' failed"
cmp -s "$work/out" "$work/help.want" || fail "'gpurun help status' differs from 'gpurun status --help'"
echo "# gpurun help [SUBCOMMAND] prints --help's text"

# --- the man pages -----------------------------------------------------------------------------
version=$(sed -n 's/^#define GPURUN_VERSION "\(.*\)"$/\1/p' "$root/client/version.h")
for m in "${mans[@]}"; do
    grep -qE "^\.TH [^ ]+ [1-8] \"\" \"gpurun $version\"" "$top/share/man/$m" ||
        fail "$m: its .TH line does not say gpurun $version: $(grep '^\.TH' "$top/share/man/$m")"
done
if command -v groff >/dev/null; then
    for m in "${mans[@]}"; do
        groff -man -ww -z "$top/share/man/$m" >"$work/lint" 2>&1 || true
        [ ! -s "$work/lint" ] || fail "groff -man -ww -z $m: $(cat "$work/lint")"
    done
    echo "# man pages: groff -man -ww prints nothing for ${mans[*]}"
else
    echo "# man pages: lint not run: no groff (scripts/deps.sh installs groff-base)"
fi

# man_tag_lines PAGE SECTION...: the .TP tags of those sections (.SH) of PAGE, '\-' as '-'.
man_tag_lines() {
    local page=$1
    shift
    awk -v want=" $* " '
        /^\.SH / { sec = $2; gsub(/"/, "", sec); on = index(want, " " sec " ") > 0; next }
        on && tag { print; tag = 0; next }
        on && /^\.TP/ { tag = 1 }' "$page" | sed 's/\\-/-/g'
}
# man_tags PAGE SECTION...: the options those tags name, a line each (-h and --help left out:
# every program takes them).
man_tags() {
    man_tag_lines "$@" | grep -oE '(^|[ "])--?[A-Za-z][a-z-]*' | tr -d ' "' |
        grep -vxE -- '-h|--help' | sort -u
}
# help_rows: the options of the help text on stdin: the leading "-X, --name" or "--name" of
# each indented line (-h and --help left out).
help_rows() {
    grep -E '^(  |      )(-[A-Za-z], )?--?[a-z]' | sed -E 's/^ +//; s/ {2,}.*//; s/ [^-].*//; s/\[=.*//' |
        sed 's/, /\n/' | grep -vxE -- '-h|--help' | sort -u || true
}
# same_list WHAT WANT GOT: the two lists are the same.
same_list() {
    [ "$2" = "$3" ] || {
        diff <(echo "$2") <(echo "$3") | sed 's/^/# /'
        fail "$1: the lists differ (< the program, > the man page)"
    }
}
gpurun_help=$(for sub in "" status logs cancel clean help; do
    # shellcheck disable=SC2086 # "" is gpurun's own help
    "$top/bin/gpurun" $sub --help
done)
same_list "gpurun.1's options" "$(help_rows <<<"$gpurun_help")" \
    "$(man_tags "$top/share/man/man1/gpurun.1" OPTIONS SUBCOMMANDS)"
# Every option the help names (torchrun's refused spellings too) is in the page somewhere.
page=$(sed 's/\\-/-/g' "$top/share/man/man1/gpurun.1")
grep -oE -- '--[a-z][a-z-]+' <<<"$gpurun_help" | sort -u | while read -r o; do
    grep -qE -- "$o([^a-z-]|$)" <<<"$page" || fail "gpurun.1 does not mention '$o' of gpurun's help"
done
same_list "rendezvousd.8's options" "$("$top/bin/rendezvousd" --help | help_rows)" \
    "$(man_tags "$top/share/man/man8/rendezvousd.8" OPTIONS)"
same_list "gpurun-train.1's options" \
    "$("$top/bin/gpurun-train" --help | grep -E '^(usage: | +)gpurun-train ' |
        grep -oE '(^|[ [])--?[A-Za-z][a-z-]*' | tr -d ' [' | sort -u)" \
    "$(man_tags "$top/share/man/man1/gpurun-train.1" OPTIONS)"
# gpurun-train(1) describes every train.cfg key of jobs/README.md's tables, and no other.
# shellcheck disable=SC2016 # the backquotes are the README's
same_list "gpurun-train.1's train.cfg keys" \
    "$(grep -oE '^\| `[a-z_0-9]+` \|' "$root/jobs/README.md" | tr -d '|` ' | sort -u)" \
    "$(man_tag_lines "$top/share/man/man1/gpurun-train.1" TRAIN.CFG | sed 's/ *"[^"]*(.*//' |
        grep -oE '[a-z_0-9]+' | grep -vx BR | sort -u)"
# gr(3) names gr.h's functions, and describes each, no other.
same_list "gr.3's NAME" "$api" \
    "$(sed -n '/^\.SH NAME/,/^\.SH SYNOPSIS/p' "$top/share/man/man3/gr.3" | grep -oE 'gr_[a-z_]+' | sort -u)"
same_list "gr.3's DESCRIPTION" "$api" \
    "$(man_tag_lines "$top/share/man/man3/gr.3" DESCRIPTION | grep -oE 'gr_[a-z_]+' | sort -u)"
if command -v man >/dev/null; then
    for m in "${mans[@]}"; do
        n=${m#*/}
        got=$(env -i PATH="$top/bin:/usr/bin:/bin" man -w "${n##*.}" "${n%.*}" 2>/dev/null || true)
        [ "$got" = "$top/share/man/$m" ] || fail "man -w ${n##*.} ${n%.*} with PREFIX/bin on PATH: '$got'"
    done
fi
echo "# man pages: each names its program's options (gr.3: gr.h's functions), man finds them"

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
# Built with the installed gr.pc alone (its prefix moved to DESTDIR's copy); the rpath is for the
# installed libgr.so outside the loader's paths.
command -v pkg-config >/dev/null || fail "no pkg-config (scripts/deps.sh installs it)"
pc() {
    PKG_CONFIG_LIBDIR="$top/lib/pkgconfig" PKG_CONFIG_PATH='' \
        pkg-config --define-variable=prefix="$top" "$@"
}
[ "$(pc --modversion gr)" = "$version" ] || fail "gr.pc's version is $(pc --modversion gr), not $version"
# shellcheck disable=SC2046 # pkg-config's flags are words
"${CC:-cc}" -std=c11 -Wall -Wextra -Werror -o "$work/crank" "$work/crank.c" \
    $(pc --cflags --libs gr) -Wl,-rpath,"$(pc --variable=libdir gr)" >"$work/out" 2>"$work/err" ||
    fail "cannot build a program with 'pkg-config --cflags --libs gr': $(cat "$work/err")"
ldd "$work/crank" | grep -F "libgr.so.1 => $top/lib/libgr.so.1" >/dev/null ||
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
    echo "shim $(readlink "/proc/$PPID/exe")" >&2
    if [ "$RANK" = 0 ]; then exec "$1"; fi
    exec "$2" -B "$3"' sh "$work/crank" "$python" "$work/pyrank.py") \
    >"$work/out" 2>"$work/err" </dev/null || rc=$?
expect_rc 0 "a job of the installed gpurun"
grep -qxF "[0] c rank 0 read 'Python side'" "$work/out" || fail "the C rank did not read the Python key"
grep -qxF "[1] py rank 1 read b'C\\x00side' from $top_real/lib/gpurun/python/gpurun/__init__.py" \
    "$work/out" || fail "the Python rank did not read the C key from the installed package"
# Each rank's shim is the installed libexec/gpurun/gpurun-shim.
[ "$(grep -c "shim $top_real/libexec/gpurun/gpurun-shim\$" "$work/err")" = 2 ] ||
    fail "the ranks' shims are not the installed gpurun-shim: $(grep shim "$work/err")"
echo "# installed gpurun: a C rank on libgr.so and a Python rank on the installed package"

# --- gr(3)'s example, built with gr.pc: on libgr.so, and on libgr.a with Libs.private -----------
awk '/^\.SH EXAMPLES/ { on = 1; next } on && /^\.fi/ { exit } on && !/^\./' \
    "$top/share/man/man3/gr.3" | sed -e 's/\\e/\\/g' -e 's/\\-/-/g' >"$work/rank.c"
grep -q 'gr_init(&g)' "$work/rank.c" || fail "no example program in gr.3: $(head -3 "$work/rank.c")"
# shellcheck disable=SC2046 # pkg-config's flags are words
"${CC:-cc}" -std=c11 -Wall -Wextra -Werror -o "$work/rank" "$work/rank.c" \
    $(pc --cflags --libs gr) -Wl,-rpath,"$(pc --variable=libdir gr)" >"$work/out" 2>"$work/err" ||
    fail "gr.3's example does not build with gr.pc: $(cat "$work/err")"
static_libs=$(pc --static --libs gr)
# shellcheck disable=SC2046,SC2086 # pkg-config's flags are words
"${CC:-cc}" -std=c11 -Wall -Wextra -Werror -o "$work/rank-static" "$work/rank.c" \
    $(pc --cflags gr) ${static_libs/-lgr/-l:libgr.a} >"$work/out" 2>"$work/err" ||
    fail "gr.3's example does not link libgr.a with 'pkg-config --static --libs gr': $(cat "$work/err")"
if ldd "$work/rank-static" | grep -q libgr; then
    fail "the static build loads libgr.so"
fi
rc=0
# shellcheck disable=SC2016 # expanded by the ranks' shell
(cd "$work" && timeout -k 5 60 "$top/bin/gpurun" --local --gpus-per-node 2 -- sh -c '
    if [ "$RANK" = 0 ]; then exec "$1"; fi
    exec "$2"' sh "$work/rank" "$work/rank-static") >"$work/out" 2>"$work/err" </dev/null || rc=$?
expect_rc 0 "gr.3's example, in a job of the installed gpurun"
for r in 0 1; do
    grep -qxF "[$r] rank $r of 2 read 'hello'" "$work/out" || fail "rank $r of gr.3's example"
done
echo "# gr.pc: gr(3)'s example built on libgr.so and on libgr.a (Libs.private), run as 2 ranks"

# --- a training job, from an empty dir, with nothing of the checkout --------------------------
# The data and the job are the test's own: text made here, shards by the installed gpurun-train.
mkdir "$work/scratch"
for ((i = 0; i < 60; i++)); do
    echo "line $i: the quick brown fox jumps over the lazy dog, and the dog sleeps on."
done >"$work/scratch/text.txt"
cat >"$work/scratch/small.cfg" <<'EOF'
# 2 ranks of a GPT-2 of one layer, 16 channels, 5 steps: well under a second.
[job]
gpus_per_node = 2
time = 5

[model]
n_layer = 1
n_head = 2
n_embd = 16
seq_len = 16
vocab_size = 256

[data]
train = data/train_*.bin
val = data/val_*.bin

[train]
batch_size = 2
steps = 5
eval_every = 0
eval_batches = 1
out_dir = out
threads = 1
sample_tokens = 8
EOF
# in_scratch CMD...: CMD in the scratch dir, with the installed bin (or $scratch_path) and the
# system's on PATH and nothing else of this environment but HOME.
in_scratch() {
    (cd "$work/scratch" && env -i HOME="$HOME" PATH="${scratch_path:-$top/bin:/usr/bin:/bin}" "$@")
}
rc=0
in_scratch gpurun-train prep text.txt -o data >"$work/out" 2>"$work/err" || rc=$?
expect_rc 0 "gpurun-train prep (installed)"
rc=0
in_scratch timeout -k 5 120 gpurun --local small.cfg >"$work/out" 2>"$work/err" </dev/null || rc=$?
expect_rc 0 "gpurun --local small.cfg (installed, from an empty dir)"
grep -qE '^\[0\] done: 5 steps in ' "$work/out" || fail "the training job did not end its 5 steps"
[ "$(wc -l <"$work/scratch/out/metrics.jsonl")" = 5 ] || fail "out/metrics.jsonl has not 5 lines"
[ -f "$work/scratch/out/ckpt_00000005.bin" ] || fail "no checkpoint of step 5 in out/"
train_job=$(sed -n 's/^gpurun: job \([^,]*\), job dir .*/\1/p' "$work/err")
[ -n "$train_job" ] || fail "no 'gpurun: job ID, job dir DIR' line from the training job"
[ -d "$HOME/.gpurun/jobs/$train_job" ] || fail "no job dir '$HOME/.gpurun/jobs/$train_job'"
# Without the installed bin on PATH, through a link elsewhere (as /usr/local/bin/gpurun may be
# to PREFIX/bin/gpurun): gpurun-train is found beside the real executable.
mkdir "$work/links"
ln -s "$top/bin/gpurun" "$work/links/gpurun"
rm -rf "$work/scratch/out"
rc=0
scratch_path=/usr/bin:/bin in_scratch timeout -k 5 120 "$work/links/gpurun" --local small.cfg \
    >"$work/out" 2>"$work/err" </dev/null || rc=$?
expect_rc 0 "a link to the installed gpurun, PATH=/usr/bin:/bin"
[ "$(wc -l <"$work/scratch/out/metrics.jsonl")" = 5 ] || fail "out/metrics.jsonl has not 5 lines"
echo "# installed gpurun --local small.cfg: 5 steps of the gpurun-train beside it, on PATH or not (job $train_job)"

# --- bash completion -------------------------------------------------------------------------
# complete_words WORD...: what the installed completion offers for the last word of "WORD...",
# a line each, sorted: bash (no profile) sources it and calls the function `complete -p gpurun`
# names, as bash does on a TAB.
complete_words() {
    # shellcheck disable=SC2016 # expanded by that bash
    env -i HOME="$HOME" PATH="$top/bin:/usr/bin:/bin" ${GPURUN_JOBS:+GPURUN_JOBS="$GPURUN_JOBS"} \
        bash --norc --noprofile -c '
        set -u
        . "$1"
        shift
        spec=$(complete -p gpurun) || exit 3
        [[ $spec =~ -F\ ([^ ]+) ]] || exit 4
        COMP_WORDS=("$@")
        COMP_CWORD=$(($# - 1))
        COMP_LINE="$*"
        COMP_POINT=${#COMP_LINE}
        COMPREPLY=()
        "${BASH_REMATCH[1]}" gpurun "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD - 1]}"
        [ ${#COMPREPLY[@]} -eq 0 ] || printf "%s\n" "${COMPREPLY[@]}"' \
        sh "$top/share/bash-completion/completions/gpurun" "$@" | LC_ALL=C sort
}
# want_completion WANT WORD...: the completion of "WORD..." is WANT (lines), in the scratch dir
# or in $in_dir.
want_completion() {
    local want=$1 got
    shift
    got=$(cd "${in_dir:-$work/scratch}" && complete_words "$@")
    [ "$got" = "$want" ] ||
        fail "completing '$*': got '$(paste -sd ' ' <<<"$got")', expected '$(paste -sd ' ' <<<"$want")'"
}
want_completion status gpurun st
want_completion --gpus-per-node gpurun --gpus-per-n
want_completion "$(printf '%s\n' --gpus --gpus-per-node --gpus-per-task)" gpurun --gpus
# Job ids: this test's jobs, the training job among them, from the jobs root in HOME.
jobs=$(cd "$HOME/.gpurun/jobs" && for f in */job.json; do echo "${f%/job.json}"; done | LC_ALL=C sort)
grep -qxF "$train_job" <<<"$jobs" || fail "the training job is not among the job dirs: $jobs"
want_completion "$jobs" gpurun status loc
want_completion "$jobs" gpurun logs ""
want_completion status gpurun help st
want_completion $'debug\nerror\ninfo\nwarn' gpurun --log-level ""
want_completion debug gpurun --log-level = d
want_completion --dry-run gpurun clean --dry
want_completion small.cfg gpurun sm
# Every subcommand and every option of the help, so that the two cannot drift apart.
mkdir "$work/empty"
in_dir=$work/empty want_completion $'cancel\nclean\nhelp\nlogs\npreflight\nrerun\nstatus' gpurun ""
# options_of [SUBCOMMAND]: the options of that help's "options:" (not torchrun's spellings).
options_of() {
    {
        "$top/bin/gpurun" "$@" --help | sed -n '/^options:$/,/^$/p' | help_rows
        printf '%s\n' -h --help
    } | LC_ALL=C sort
}
want_completion "$(options_of)" gpurun -
want_completion "$(options_of logs)" gpurun logs -
# Job ids from $GPURUN_JOBS where it is set: its dirs that hold a job.json.
mkdir -p "$work/jobs/local-20300101-000000-1" "$work/jobs/7" "$work/jobs/not-a-job"
touch "$work/jobs/local-20300101-000000-1/job.json" "$work/jobs/7/job.json" "$work/jobs/7.out"
GPURUN_JOBS=$work/jobs want_completion $'7\nlocal-20300101-000000-1' gpurun cancel ""
echo "# bash completion: subcommands, options and their values from gpurun's help; job ids"

# --- make uninstall --------------------------------------------------------------------------
rc=0
(cd "$root" && env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make --no-print-directory \
    BUILD="$build" DESTDIR="$dest" PREFIX="$prefix" uninstall) >"$work/out" 2>"$work/err" || rc=$?
expect_rc 0 "make uninstall DESTDIR=$dest PREFIX=$prefix"
left=$(find "$dest" -mindepth 1 | sed "s|^$dest||" | paste -sd ' ')
[ -z "$left" ] || fail "make uninstall left: $left"
# Directories that were there before install stay, with what is in them; empty ones too.
dest2=$work/dest2
mkdir -p "$dest2$prefix/share/man/man1" "$dest2$prefix/lib/pkgconfig"
echo mine >"$dest2$prefix/share/man/man1/other.1"
for target in install install uninstall; do
    rc=0
    (cd "$root" && env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make --no-print-directory \
        BUILD="$build" DESTDIR="$dest2" PREFIX="$prefix" "$target") >"$work/out" 2>"$work/err" ||
        rc=$?
    expect_rc 0 "make $target DESTDIR=$dest2 PREFIX=$prefix"
done
left=$(cd "$dest2" && find . -mindepth 1 | LC_ALL=C sort | paste -sd ' ')
want=$(printf '.%s\n' /opt "$prefix" "$prefix/lib" "$prefix/lib/pkgconfig" "$prefix/share" \
    "$prefix/share/man" "$prefix/share/man/man1" "$prefix/share/man/man1/other.1" | paste -sd ' ')
[ "$left" = "$want" ] || fail "make install twice, then uninstall, over existing dirs left: $left"
echo "# make uninstall: nothing left under DESTDIR, not even the directories install made (twice)"

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
c_version=$(sed -n 's/^#define GPURUN_VERSION "\(.*\)"$/\1/p' "$root/client/version.h")
v=$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' "$root/lib/rank/python/gpurun/__init__.py")
[ -n "$v" ] || fail "no __version__ line in lib/rank/python/gpurun/__init__.py"
want="$work/site/gpurun/__init__.py $v $v 0 None"
[ "$got" = "$want" ] || fail "import gpurun from the pip target: got '$got', expected '$want'"
[ "$v" = "$c_version" ] || fail "the Python package is version $v, gpurun (client/version.h) $c_version"
echo "# pip install --target: import gpurun $v from the target, metadata agrees"
