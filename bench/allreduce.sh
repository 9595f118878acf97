#!/bin/bash
# The allreduce benchmark: the collectives' tcp backend (build/bench/allreduce under
# `gpurun --local`) against OpenMPI's MPI_Allreduce (build/bench/mpi_allreduce under mpirun),
# in place, sum of floats, 1 MiB to 256 MiB, with 2 and 4 ranks on this machine. Each runs
# twice: as it runs by default (the ring's links between ranks of one machine go through
# shared memory; OpenMPI picks its shared-memory transport), and with every byte over TCP on
# loopback (GPURUN_COLL_SHM=0; --mca btl tcp,self), the transport between nodes. Prints one
# markdown table. Targets: the ring at least as fast as OpenMPI, like for like, at every size;
# and from 16 MiB, at least 80% of its floor: what memcpy moves per rank with every rank
# copying at once (shared memory), and what loopback TCP carries per link with every rank
# sending to the next at once (TCP), both measured in the same run (allreduce --floor).
#
# Bus bandwidth = 2(W-1)/W * bytes / time: what each rank moves over its links, comparable
# across rank counts (nccl-tests' busbw). Each time is the mean per call of the slowest rank in
# the fastest of three batches, and the best of the rounds (the ring's and OpenMPI's cells):
# this machine may be shared with other work, which should not decide a row for one side.
# Against a floor, each round's ring is divided by the floor measured right after it, and the
# row shows the median of those ratios over the rounds (paired and median_vs, below).
#
# Environment (all optional):
#   BUILD                   build dir (default build/ of the source tree)
#   BENCH_AR_WORLDS         rank counts (default "2 4")
#   BENCH_AR_MIN_BYTES      smallest buffer (default 1 MiB)
#   BENCH_AR_MAX_BYTES      largest buffer (default 256 MiB); sizes go up by 4x
#   BENCH_AR_ROUNDS         rounds of every run, alternating ring, floors and OpenMPI; each
#                           row shows the best round of the ring and of OpenMPI, and the
#                           median over the rounds against the floors (default 5)
#   BENCH_SKIP_ANCHORS=1    measure the tcp ring and its floors only
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${BUILD:-build}
[[ $BUILD == /* ]] || BUILD=$root/$BUILD
WORLDS=${BENCH_AR_WORLDS:-2 4}
MIN_BYTES=${BENCH_AR_MIN_BYTES:-1048576}
MAX_BYTES=${BENCH_AR_MAX_BYTES:-268435456}
ROUNDS=${BENCH_AR_ROUNDS:-5}
SKIP_ANCHORS=${BENCH_SKIP_ANCHORS:-0}
# A bound on every run: the whole benchmark takes about three minutes here.
LIMIT=${BENCH_AR_LIMIT:-300}

for p in gpurun rendezvousd bench/allreduce bench/handoff; do
    if [ ! -x "$BUILD/$p" ]; then
        echo "allreduce.sh: '$BUILD/$p' is not built (run 'make all')" >&2
        exit 1
    fi
done
no_mpi=
if [ "$SKIP_ANCHORS" = 1 ]; then
    no_mpi="skipped: BENCH_SKIP_ANCHORS=1"
elif ! command -v mpirun >/dev/null; then
    no_mpi="skipped: no mpirun (OpenMPI) installed"
elif [ ! -x "$BUILD/bench/mpi_allreduce" ]; then
    no_mpi="skipped: '$BUILD/bench/mpi_allreduce' is not built (no mpicc)"
fi

scratch=$(mktemp -d "${TMPDIR:-/tmp}/gr-bench-ar.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
mkdir -p "$scratch/home"

args=(--min-bytes "$MIN_BYTES" --max-bytes "$MAX_BYTES")

# ours W NAME SHM [FLOOR]: the ring's lines (or, with FLOOR, that floor's; with "paired", the
# ring's with its paired memcpy floor) appended to $scratch/NAME-W, with GPURUN_COLL_SHM=SHM.
ours() {
    local w=$1 name=$2 rc=0 what=("${args[@]}")
    case ${4:-} in
    "") ;;
    paired) what+=(--paired-floor) ;;
    *) what+=(--floor "$4") ;;
    esac
    GPURUN_COLL_SHM=$3 HOME=$scratch/home timeout -k 5 "$LIMIT" "$BUILD/gpurun" --local \
        --gpus-per-node "$w" --job-dir "$scratch/job-$name-$w-$round" -- "$BUILD/bench/allreduce" \
        "${what[@]}" >"$scratch/$name-$w.out" 2>"$scratch/$name-$w.err" </dev/null || rc=$?
    sed -n "s/^\[0\] \(allreduce .*\|floor .*\)/round=$round \1/p" "$scratch/$name-$w.out" \
        >>"$scratch/$name-$w"
    if [ "$rc" != 0 ]; then
        echo "allreduce.sh: the ring's run ($name) with $w ranks failed (status $rc):" >&2
        tail -n 5 "$scratch/$name-$w.out" "$scratch/$name-$w.err" >&2
    fi
}

# mpi W NAME MCA...: OpenMPI's lines appended to $scratch/NAME-W.
mpi() {
    local w=$1 name=$2 rc=0
    shift 2
    [ -z "$no_mpi" ] || return 0
    timeout -k 5 "$LIMIT" mpirun --allow-run-as-root --oversubscribe "$@" -np "$w" \
        "$BUILD/bench/mpi_allreduce" "${args[@]}" >"$scratch/$name-$w.out" \
        2>"$scratch/$name-$w.err" </dev/null || rc=$?
    grep '^allreduce ' "$scratch/$name-$w.out" >>"$scratch/$name-$w" || true
    if [ "$rc" != 0 ]; then
        echo "allreduce.sh: OpenMPI ($name) with $w ranks failed (status $rc):" >&2
        tail -n 5 "$scratch/$name-$w.err" >&2
    fi
}

# field FILE BYTES KEY: KEY's value on FILE's line for BYTES of the best round (the one with
# the highest bandwidth: busbw_gbs, or a floor's gbs), or nothing.
field() {
    [ -f "$1" ] || return 0
    awk -v bytes="$2" -v key="$3" '
        {
            by = ""; bw = ""; v = "";
            for (i = 1; i <= NF; i++) {
                n = index($i, "=");
                if (!n) continue;
                k = substr($i, 1, n - 1); x = substr($i, n + 1);
                if (k == "bytes") by = x;
                if (k == "busbw_gbs" || k == "gbs") bw = x;
                if (k == key) v = x;
            }
            if (by == bytes && bw != "" && (best == "" || bw + 0 > best + 0)) { best = bw; out = v }
        }
        END { if (best != "") print out }' "$1"
}

# What the two pairings below share, in awk: get(KEY), the value of KEY=VALUE on the line; and
# at the end, "RATIO FLOOR" of the median of the n ratios collected in ratio[] (the lower
# middle one of an even count), with the floor collected beside it in fl[]; or nothing.
# shellcheck disable=SC2016 # awk's fields, not the shell's
MEDIAN_AWK='
    BEGIN { n = 0 }
    function get(key,   i, k) {
        for (i = 1; i <= NF; i++) {
            k = index($i, "=");
            if (k && substr($i, 1, k - 1) == key) return substr($i, k + 1);
        }
        return "";
    }
    END {
        if (!n) exit;
        for (i = 1; i < n; i++)
            for (j = i; j > 0 && ratio[j - 1] > ratio[j]; j--) {
                x = ratio[j]; ratio[j] = ratio[j - 1]; ratio[j - 1] = x
                x = fl[j]; fl[j] = fl[j - 1]; fl[j - 1] = x
            }
        m = int((n - 1) / 2);
        print ratio[m], fl[m];
    }'

# paired RING FLOOR BYTES: the ring against its floor round by round (each round runs the
# floor right after the ring): "RATIO FLOOR", the median over the rounds of the ring's busbw
# over the floor's gbs of the same round, and that round's floor; or nothing. Round by round,
# because the floor moves with the machine's state more than the ring does: on this VM the
# memcpy floor of 2 ranks at 16 MiB is 8-12 GB/s while the two CPUs share one L3 and 22 GB/s
# while each has its own, where every ring is slower; the best ring and the best floor of
# several rounds are then of different machines.
paired() {
    [ -f "$1" ] && [ -f "$2" ] || return 0
    awk -v bytes="$3" "$MEDIAN_AWK"'
        get("bytes") != bytes { next }
        FILENAME == ARGV[1] { ring[get("round")] = get("busbw_gbs"); next }
        get("round") in ring && get("gbs") + 0 > 0 {
            ratio[n] = ring[get("round")] / get("gbs"); fl[n] = get("gbs"); n++
        }' "$1" "$2"
}

# median_vs FILE BYTES: "RATIO FLOOR" of a --paired-floor ring's lines for BYTES: the median
# over the rounds of each round's vs_floor (itself the median over its batches), and that
# round's floor_gbs; or nothing.
median_vs() {
    [ -f "$1" ] || return 0
    awk -v bytes="$2" "$MEDIAN_AWK"'
        get("bytes") == bytes && get("vs_floor") + 0 > 0 {
            ratio[n] = get("vs_floor") + 0; fl[n] = get("floor_gbs"); n++
        }' "$1"
}

# handoff: the cache line round trip between two CPUs, in ns, or "unknown".
handoff() {
    local out
    out=$("$BUILD/bench/handoff" 2>/dev/null) || true
    sed -n 's/^handoff .*round_trip_ns=\([0-9]*\).*/\1 ns/p' <<<"$out" | grep . || echo unknown
}

handoff_before=$(handoff)
for ((round = 0; round < ROUNDS; round++)); do
    for w in $WORLDS; do
        ours "$w" ring 1 paired
        ours "$w" floor-memcpy 1 memcpy
        mpi "$w" mpi-sm
        ours "$w" ring-tcp 0
        ours "$w" floor-loopback 0 loopback
        mpi "$w" mpi-tcp --mca btl tcp,self --mca btl_tcp_if_include lo
    done
done

handoff_after=$(handoff)
load=$(cut -d' ' -f1-3 /proc/loadavg)
echo "## Allreduce bandwidth (sum of fp32, in place; $(nproc) CPUs, load $load)"
echo
echo "Bus bandwidth in GB/s: 2(W-1)/W x bytes / time per call (slowest rank, fastest of 3"
echo "batches, best of $ROUNDS rounds)."
echo "Default: the ring with its shared-memory links on one machine, OpenMPI with its defaults"
echo "(shared memory). Its floor: GB/s of memcpy per rank, every rank copying at once. Paired: each"
echo "batch of the ring followed at once by a batch of memcpy on the same buffer, in the same run;"
echo "the median over the batches and then over the rounds of the ring over the floor after it,"
echo "and that floor. Alone: the floor's own runs, the best round, against the best ring (shown)."
echo "TCP: every byte over loopback TCP (GPURUN_COLL_SHM=0; --mca btl tcp,self). Its floor: GB/s"
echo "per link with every rank sending to the next over loopback TCP at once, in the run right after"
echo "the ring's of each round; the median over the rounds of the ring over its round's floor."
echo "Targets: the ring at least as fast as OpenMPI's MPI_Allreduce; from 16 MiB, at least 0.8x"
echo "its floor."
echo "A cache line from one CPU to another and back (bench/handoff): $handoff_before before the"
echo "runs, $handoff_after after. Around 60 ns, the CPUs share a cache; several hundred, they do not,"
echo "and every transfer through shared memory is slower (on a VM the host may switch between the"
echo "two for seconds at a time)."
echo
echo "| size | ranks | ring ms | ring busbw | OpenMPI busbw | ring vs OpenMPI | memcpy floor, paired | ring vs floor | memcpy floor, alone | ring vs it | ring TCP busbw | OpenMPI TCP busbw | ring vs OpenMPI, TCP | loopback floor | ring TCP vs floor |"
echo "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
for w in $WORLDS; do
    for ((bytes = MIN_BYTES; bytes <= MAX_BYTES; bytes *= 4)); do
        awk -v b="$bytes" -v w="$w" -v none="${no_mpi:-failed}" \
            -v t="$(field "$scratch/ring-$w" "$bytes" time_us)" \
            -v bw="$(field "$scratch/ring-$w" "$bytes" busbw_gbs)" \
            -v sm="$(field "$scratch/mpi-sm-$w" "$bytes" busbw_gbs)" \
            -v pm="$(median_vs "$scratch/ring-$w" "$bytes")" \
            -v fa="$(field "$scratch/floor-memcpy-$w" "$bytes" gbs)" \
            -v bwt="$(field "$scratch/ring-tcp-$w" "$bytes" busbw_gbs)" \
            -v tcp="$(field "$scratch/mpi-tcp-$w" "$bytes" busbw_gbs)" \
            -v pl="$(paired "$scratch/ring-tcp-$w" "$scratch/floor-loopback-$w" "$bytes")" '
            # ratio(a, r, want): a / r, marked against want (none: shown only).
            function ratio(a, r, want) {
                if (a == "" || r == "") return "";
                if (want == "") return sprintf("%.2fx", a / r);
                return sprintf("%.2fx %s", a / r, a >= want * r ? "met" : "**missed**");
            }
            # vs(pair, want): the median ratio of "RATIO FLOOR", marked against want.
            function vs(pair, want,   p) {
                if (pair == "") return "";
                split(pair, p, " ");
                return ratio(p[1], 1, want);
            }
            BEGIN {
                split(pm, m, " "); fm = m[2]; split(pl, l, " "); fl = l[2];
                size = b >= 1048576 ? sprintf("%d MiB", b / 1048576) : sprintf("%d KiB", b / 1024);
                floor_want = b >= 16 * 1048576 ? 0.8 : "";
                printf "| %s | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n",
                    size, w, t == "" ? "failed" : sprintf("%.2f", t / 1000),
                    bw == "" ? "failed" : bw, sm == "" ? none : sm, ratio(bw, sm, 1),
                    fm == "" ? "failed" : fm, vs(pm, floor_want),
                    fa == "" ? "failed" : fa, ratio(bw, fa, ""),
                    bwt == "" ? "failed" : bwt, tcp == "" ? none : tcp, ratio(bwt, tcp, 1),
                    fl == "" ? "failed" : fl, vs(pl, floor_want);
            }'
    done
done
