# Shared by the frameworks lane, tests/integ/fw_*.sh, and by python_frameworks.sh (sourced,
# not run): the real frameworks from PyPI, pinned, installed against Debian's torch into the
# build tree and kept there, and a lane job run in both layouts of a world of 2 (one node of
# 2 ranks, two emulated nodes of 1) with its lane lines checked (tests/python/lane.py).
# shellcheck shell=bash
# The variables set here (FW_*, fw_why) are read by the scripts that source this file.
# shellcheck disable=SC2034

# shellcheck source=local_common.sh
. "$(dirname "${BASH_SOURCE[0]}")/local_common.sh"

python=${GPURUN_PYTHON:-/usr/bin/python3}
deps=${GPURUN_PYDEPS:-$build/python-deps}
# The longest one pip install may take (a slow mirror); past it the framework is skipped.
PIP_LIMIT=${PIP_LIMIT:-300}
# A lane job's bound: the slowest (DeepSpeed's imports) takes about 20 s on 2 busy CPUs.
FW_JOB_LIMIT=${FW_JOB_LIMIT:-240}
export PYTHONDONTWRITEBYTECODE=1 GLOO_SOCKET_IFNAME=lo

# The sets, pinned (FW_LIGHTNING, FW_HF).
# shellcheck source=fw_pins.sh
. "$(dirname "${BASH_SOURCE[0]}")/fw_pins.sh"

# fw_need_python: skips unless $python has Debian's torch and pip.
fw_need_python() {
    [ -x "$python" ] || skip "no '$python'"
    "$python" -c 'import importlib.util as u; assert u.find_spec("torch")' >/dev/null 2>&1 ||
        skip "'$python' has no torch (Debian's python3-torch)"
    "$python" -m pip --version >/dev/null 2>&1 ||
        skip "'$python -m pip' does not run (python3-pip)"
}

# fw_install NAME PKG...: $deps/NAME holds PKG... (pip install --no-deps, pinned: a wheel
# where the version has one, else its source release, built against this Python's own
# packages: DeepSpeed's setup.py imports torch), installed now unless its stamp lists the same
# set. Returns 1 with the reason in fw_why when pip cannot make it so within PIP_LIMIT.
fw_install() {
    local name=$1 dir=$deps/$1 t0 rc=0
    shift
    fw_why=
    if [ -f "$dir/.stamp" ] && [ "$(cat "$dir/.stamp")" = "$*" ]; then
        echo "# $name: installed already in $dir"
        return 0
    fi
    rm -rf "$dir" "$dir.tmp"
    mkdir -p "$deps"
    t0=$(date +%s%N)
    timeout -k 5 "$PIP_LIMIT" "$python" -m pip install --quiet --disable-pip-version-check \
        --no-deps --prefer-binary --no-build-isolation --no-warn-script-location \
        --target "$dir.tmp" "$@" >"$work/pip-$name.out" 2>&1 || rc=$?
    echo "# $name: pip install of $# packages took $((($(date +%s%N) - t0) / 1000000)) ms"
    if [ "$rc" != 0 ]; then
        rm -rf "$dir.tmp"
        if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
            fw_why="$name: pip install took over $PIP_LIMIT s"
        else
            fw_why="$name: pip install failed: $(grep -m1 -E 'ERROR|error' "$work/pip-$name.out" ||
                tail -n1 "$work/pip-$name.out")"
        fi
        return 1
    fi
    echo "$*" >"$dir.tmp/.stamp"
    mv "$dir.tmp" "$dir"
}

# fw_threads: the intra-op threads a rank should get when 2 ranks share this machine.
fw_threads() {
    local n
    n=$(($(nproc) / 2))
    echo $((n < 1 ? 1 : n))
}

# fw_layout_args LAYOUT: gpurun's options for "1x2" (a node of 2 ranks) or "2x1".
fw_layout_args() {
    case $1 in
    1x2) echo "--nodes 1 --gpus-per-node 2" ;;
    2x1) echo "--nodes 2 --gpus-per-node 1" ;;
    *) fail "no layout '$1'" ;;
    esac
}

# fw_run NAME LAYOUT [GPURUN_OPTION...] -- CMD...: the job under gpurun --local in LAYOUT,
# job dir $work/NAME-LAYOUT, output in $work/NAME-LAYOUT.{out,err}; sets rc.
fw_run() {
    local name=$1 layout=$2 t0 opts=()
    shift 2
    while [ "$1" != -- ]; do
        opts+=("$1")
        shift
    done
    shift
    rc=0
    t0=$(date +%s%N)
    # shellcheck disable=SC2046 # the layout's words
    timeout -k 5 "$FW_JOB_LIMIT" "$gpurun" --local $(fw_layout_args "$layout") \
        --job-dir "$work/$name-$layout" "${opts[@]}" -- "$@" \
        >"$work/$name-$layout.out" 2>"$work/$name-$layout.err" </dev/null || rc=$?
    echo "# $name $layout: exit $rc in $((($(date +%s%N) - t0) / 1000000)) ms"
    fail_show=("$name-$layout.out" "$name-$layout.err")
}

# fw_lines NAME LAYOUT: the job's lane lines, "[R] " taken off, one a rank, by rank.
fw_lines() {
    sed -nE 's/^\[[0-9]+\] (lane .*)$/\1/p' "$work/$1-$2.out" | sort -t' ' -k4,4
}

# fw_check NAME LAYOUT: the job completed (exit 0, its ranks met: summary.json), each of its
# 2 ranks printed its lane line with world 2, its own rank and local rank, the threads of
# fw_threads and the parameters of the other. Prints the parameters' digest.
fw_check() {
    local name=$1 layout=$2 lines want r lr local_world digest
    [ "$rc" = 0 ] || fail "$name $layout: gpurun exited with status $rc, not 0"
    grep -q '"ranks_met": true' "$work/$name-$layout/summary.json" ||
        fail "$name $layout: summary.json does not say the ranks met"
    grep -q 'never met' "$work/$name-$layout.err" &&
        fail "$name $layout: gpurun says the ranks never met: $(grep 'never met' "$work/$name-$layout.err")"
    lines=$(fw_lines "$name" "$layout")
    [ "$(echo "$lines" | grep -c .)" = 2 ] ||
        fail "$name $layout: not one lane line from each of 2 ranks: '$lines'"
    [ "$layout" = 1x2 ] && local_world=2 || local_world=1
    digest=$(echo "$lines" | sed -nE 's/.* params ([0-9a-f]+)$/\1/p' | sort -u)
    for r in 0 1; do
        lr=0
        [ "$layout" = 1x2 ] && lr=$r
        want="lane $name rank $r/2 local $lr/$local_world threads $(fw_threads) "
        echo "$lines" | grep -q "^$want" ||
            fail "$name $layout: no rank's line begins '$want'; the lines: '$lines'"
    done
    [ "$(echo "$digest" | grep -c .)" = 1 ] ||
        fail "$name $layout: the ranks' parameters differ: '$lines'"
    echo "$digest"
}

# fw_both NAME -- CMD...: the job in both layouts, each checked by fw_check, and the same
# parameters from both.
fw_both() {
    local name=$1 d1 d2
    shift 2
    fw_run "$name" 1x2 -- "$@"
    d1=$(fw_check "$name" 1x2) || { echo "$d1"; exit 1; }
    echo "# $name 1x2: $(fw_lines "$name" 1x2 | head -n1)"
    fw_run "$name" 2x1 -- "$@"
    d2=$(fw_check "$name" 2x1) || { echo "$d2"; exit 1; }
    echo "# $name 2x1: $(fw_lines "$name" 2x1 | head -n1)"
    [ "$d1" = "$d2" ] ||
        fail "$name: parameters $d1 after 1x2 but $d2 after 2x1 (the same world, the same data)"
}
