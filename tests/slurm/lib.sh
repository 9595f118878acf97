#!/bin/bash
# A real Slurm cluster on this one machine, for the tests: munged, slurmctld and one slurmd
# per node, each daemon in a network namespace of its own on a private bridge, each node with
# its own hostname (a UTS namespace) and fake GPUs (character devices). What up.sh, down.sh
# and the tests/integ/slurm_*.sh scripts share; README.md beside this file tells the story.
#
# Library:       . tests/slurm/lib.sh; grs_exec 2 hostname
# Command line:  tests/slurm/lib.sh exec K CMD...   run CMD inside node K (1..N): its network
#                                                  and its hostname, as a job step there sees
#                tests/slurm/lib.sh env            print the env file's path (after up.sh)
#                tests/slurm/lib.sh nodes          print "NAME ADDRESS" per node
#
# Settings (environment, all optional; up.sh writes what it used into the env file):
#   GR_SLURM_ID       instance 0..99 (default 0): the other defaults derive from it, so that
#                     two clusters can run side by side
#   GR_SLURM_DIR      work dir: config, state, spool, logs, pid files, fake devices
#                     (default /tmp/gpurun-slurm, /tmp/gpurun-slurm-ID for ID > 0)
#   GR_SLURM_NODES    number of nodes, named node1..nodeN (default 3)
#   GR_SLURM_CPUS     CPUs each node advertises, real cores or not (default 8)
#   GR_SLURM_GPUS     fake GPUs per node, 0 for none (default 8)
#   GR_SLURM_SUBNET   three octets of the private /24 (default 10.214.ID): the host is .1,
#                     slurmctld .2, node K .(10+K)
#   GR_SLURM_HOSTS    1: add "ADDRESS nodeK" lines to /etc/hosts (tagged, removed by down.sh;
#                     default 1 for ID 0, else 0: node names are the same in every instance)
#   GR_SLURM_WAIT     seconds up.sh waits for every node to be idle (default 20)
#   GR_SLURM_SLURMD_TIMEOUT  slurm.conf's SlurmdTimeout: seconds of silence after which
#                     slurmctld marks a node DOWN (default 30; a test of a node's death
#                     lowers it)
#
# Skips: grs_check prints "# SKIP <reason>" and returns 77 when this machine cannot host the
# cluster (not root, a Slurm or munge program missing, no network namespaces).
# shellcheck shell=bash
# The settings below are read by the scripts that source this file.
# shellcheck disable=SC2034

# A library must not change the shell options of the script that sources it.
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    set -euo pipefail
    GRS_MAIN=1
else
    GRS_MAIN=0
fi

GRS_ID=${GR_SLURM_ID:-0}
if ! [[ $GRS_ID =~ ^[0-9]{1,2}$ ]]; then
    echo "slurm: GR_SLURM_ID '$GRS_ID' must be a number from 0 to 99" >&2
    GRS_ID=0
fi
GRS_ID=$((10#$GRS_ID))
if [ "$GRS_ID" = 0 ]; then
    GRS_DIR=${GR_SLURM_DIR:-/tmp/gpurun-slurm}
else
    GRS_DIR=${GR_SLURM_DIR:-/tmp/gpurun-slurm-$GRS_ID}
fi
GRS_NODES=${GR_SLURM_NODES:-3}
GRS_CPUS=${GR_SLURM_CPUS:-8}
GRS_GPUS=${GR_SLURM_GPUS:-8}
GRS_SLURMD_TIMEOUT=${GR_SLURM_SLURMD_TIMEOUT:-30}
GRS_SUBNET=${GR_SLURM_SUBNET:-10.214.$GRS_ID}
GRS_HOSTS=${GR_SLURM_HOSTS:-$([ "$GRS_ID" = 0 ] && echo 1 || echo 0)}
GRS_WAIT=${GR_SLURM_WAIT:-20}
# Every daemon has a namespace of its own, so the usual ports are free whatever runs on the
# host (a real Slurm included).
GRS_CTLD_PORT=6817
GRS_SLURMD_PORT=6818
# Namespace and interface names, at most 15 bytes: grs<ID>s the switch (a namespace with
# the bridge), grs<ID>c the controller's namespace, grs<ID>n<K> node K's, grs<ID>h the host's
# link to the switch.
GRS_SWITCH_NS=grs${GRS_ID}s
GRS_HOST_VETH=grs${GRS_ID}h
GRS_CTLD_NS=grs${GRS_ID}c
GRS_HOSTS_TAG="# gpurun-slurm-$GRS_ID"
GRS_CTLD_ADDR=$GRS_SUBNET.2

grs_node_name() { echo "node$1"; }
grs_node_ns() { echo "grs${GRS_ID}n$1"; }
grs_node_addr() { echo "$GRS_SUBNET.$((10 + $1))"; }

grs__err() {
    echo "slurm: $*" >&2
}

grs__skip() {
    echo "# SKIP $*"
    return 77
}

# Returns 0 when the settings make sense and this machine can host the cluster, 77 (with
# "# SKIP <reason>") when it cannot, 2 for a bad setting.
grs_check() {
    local p probe
    if ! [[ $GRS_NODES =~ ^[0-9]+$ ]] || [ "$GRS_NODES" -lt 1 ] || [ "$GRS_NODES" -gt 200 ]; then
        grs__err "GR_SLURM_NODES '$GRS_NODES' must be 1..200"
        return 2
    fi
    if ! [[ $GRS_CPUS =~ ^[0-9]+$ ]] || [ "$GRS_CPUS" -lt 1 ]; then
        grs__err "GR_SLURM_CPUS '$GRS_CPUS' must be a positive number"
        return 2
    fi
    if ! [[ $GRS_GPUS =~ ^[0-9]+$ ]] || [ "$GRS_GPUS" -gt 64 ]; then
        grs__err "GR_SLURM_GPUS '$GRS_GPUS' must be 0..64"
        return 2
    fi
    if ! [[ $GRS_SLURMD_TIMEOUT =~ ^[0-9]+$ ]] || [ "$GRS_SLURMD_TIMEOUT" -lt 5 ]; then
        grs__err "GR_SLURM_SLURMD_TIMEOUT '$GRS_SLURMD_TIMEOUT' must be 5 seconds or more"
        return 2
    fi
    if ! [[ $GRS_SUBNET =~ ^[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}$ ]]; then
        grs__err "GR_SLURM_SUBNET '$GRS_SUBNET' must be three octets, like 10.214.0"
        return 2
    fi
    if [[ $GRS_DIR != /* ]] || [[ $GRS_DIR =~ [[:space:]] ]] || [ "$GRS_DIR" = / ]; then
        grs__err "GR_SLURM_DIR '$GRS_DIR' must be an absolute path without spaces"
        return 2
    fi
    [ "$(id -u)" = 0 ] || {
        grs__skip "the Slurm test cluster needs root (namespaces, mknod, /etc/hosts)"
        return
    }
    for p in slurmctld slurmd srun sbatch sinfo squeue scancel scontrol munged munge \
        ip nsenter unshare mknod; do
        if ! command -v "$p" >/dev/null && ! [ -x "/usr/sbin/$p" ]; then
            grs__skip "no '$p' here (scripts/deps.sh installs slurmctld, slurmd, slurm-client, munge)"
            return
        fi
    done
    probe=grs${GRS_ID}probe
    if ! ip netns add "$probe" 2>/dev/null; then
        grs__skip "cannot create a network namespace here ('ip netns add' failed)"
        return
    fi
    ip netns del "$probe" 2>/dev/null || true
    return 0
}

# True while PID runs: a zombie (exited, not yet reaped by an init that takes its time)
# counts as gone, so 'kill -0' is no test.
grs_alive() {
    local stat
    stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
    stat=${stat##*) }
    [ "${stat%% *}" != Z ]
}

# The pid in pid file FILE when that process runs and its command is COMM (a pid file of an
# earlier boot or a recycled pid names another program); nothing otherwise.
grs_pidfile() {
    local pid comm
    pid=$(cat "$1" 2>/dev/null) || return 0
    [[ $pid =~ ^[0-9]+$ ]] || return 0
    comm=$(cat "/proc/$pid/comm" 2>/dev/null) || return 0
    [ "$comm" = "$2" ] && grs_alive "$pid" && echo "$pid"
    return 0
}

grs_now_ms() {
    local ns
    ns=$(date +%s%N)
    echo $((ns / 1000000))
}

# The pid of node K's slurmd, when it runs.
grs_slurmd_pid() {
    grs_pidfile "$GRS_DIR/run/slurmd-$(grs_node_name "$1").pid" slurmd
}

# Runs a command inside node K (1..N): in its network namespace and, while its slurmd runs,
# in its UTS namespace (the node's hostname), as the tasks of a job step on it are.
grs_exec() {
    local k=${1:-} pid
    if ! [[ $k =~ ^[0-9]+$ ]] || [ ! -e "/run/netns/$(grs_node_ns "$k")" ]; then
        grs__err "no node '$k' (nodes: 1..$GRS_NODES; is the cluster up?)"
        return 2
    fi
    shift
    pid=$(grs_slurmd_pid "$k")
    if [ -n "$pid" ]; then
        nsenter --net="/run/netns/$(grs_node_ns "$k")" --uts="/proc/$pid/ns/uts" -- "$@"
    else
        nsenter --net="/run/netns/$(grs_node_ns "$k")" -- "$@"
    fi
}

# The namespaces of this instance that exist now.
grs__namespaces() {
    local ns
    for ns in /run/netns/grs"${GRS_ID}"[cs] /run/netns/grs"${GRS_ID}"n*; do
        [ -e "$ns" ] && echo "${ns##*/}"
    done
    return 0
}

# The pids of every process inside this instance's namespaces: the daemons, slurmstepd and
# the tasks of jobs. Nothing else runs there, so they are all ours.
grs__ns_pids() {
    local ns
    for ns in $(grs__namespaces); do
        ip netns pids "$ns" 2>/dev/null
    done
    return 0
}

# Sends SIG to PIDS (a list) and waits up to MS milliseconds for all of them to go; returns
# 1 when some still run.
grs__stop_pids() {
    local sig=$1 ms=$2 pids=$3 pid deadline left
    [ -n "$pids" ] || return 0
    # shellcheck disable=SC2086 # a list of pids
    kill "-$sig" $pids 2>/dev/null || true
    deadline=$(($(grs_now_ms) + ms))
    while :; do
        left=
        for pid in $pids; do
            grs_alive "$pid" && left+=" $pid"
        done
        [ -z "$left" ] && return 0
        [ "$(grs_now_ms)" -ge "$deadline" ] && return 1
        sleep 0.02
    done
}

# Stops everything up.sh started, by pid, and removes the namespaces (the bridge and links go
# with them) and the
# /etc/hosts lines: jobs are cancelled first (their steps and tasks end), then the slurmds,
# slurmctld and munged get SIGTERM, and whatever still runs in the namespaces SIGKILL.
# Idempotent; a no-op when nothing is up. Keeps the work dir (logs) for a look afterwards.
grs_down() {
    local pids ns k i jobs conf=$GRS_DIR/etc/slurm.conf ctld
    ctld=$(grs_pidfile "$GRS_DIR/run/slurmctld.pid" slurmctld)
    if [ -n "$ctld" ] && [ -f "$conf" ]; then
        # scancel returns once slurmctld has the request; the steps end on their nodes a
        # moment later (KillWait in slurm.conf bounds it).
        jobs=$(SLURM_CONF=$conf timeout 3 squeue -h -o %A 2>/dev/null | tr '\n' ' ') || jobs=
        if [ -n "${jobs// /}" ]; then
            # shellcheck disable=SC2086 # a list of job ids
            SLURM_CONF=$conf timeout 3 scancel --quiet $jobs >/dev/null 2>&1 || true
            for ((i = 0; i < 40; i++)); do
                [ -z "$(SLURM_CONF=$conf timeout 2 squeue -h -t R,CG,S -o %A 2>/dev/null)" ] &&
                    break
                sleep 0.05
            done
        fi
    fi
    pids=
    for ((k = 1; k <= 200; k++)); do
        [ -e "$GRS_DIR/run/slurmd-$(grs_node_name "$k").pid" ] || [ -e "/run/netns/$(grs_node_ns "$k")" ] ||
            break
        pids+=" $(grs_slurmd_pid "$k")"
    done
    grs__stop_pids TERM 1500 "$pids" || true
    grs__stop_pids TERM 1500 "$ctld" || true
    grs__stop_pids TERM 1000 "$(grs_pidfile "$GRS_DIR/run/munged.pid" munged)" || true
    # What is left in the namespaces: steps of jobs that did not end, strays of an earlier
    # run whose pid files are gone.
    pids=$(grs__ns_pids | sort -u | tr '\n' ' ')
    if [ -n "${pids// /}" ]; then
        grs__stop_pids KILL 2000 "$pids" ||
            grs__err "processes still running after SIGKILL: $pids"
    fi
    for ns in $(grs__namespaces); do
        ip netns del "$ns" 2>/dev/null || grs__err "cannot delete namespace '$ns'"
    done
    # The host's end of its link to the switch goes with the switch's namespace.
    if ip link show "$GRS_HOST_VETH" >/dev/null 2>&1; then
        ip link del "$GRS_HOST_VETH" 2>/dev/null || grs__err "cannot delete link '$GRS_HOST_VETH'"
    fi
    grs__hosts_remove
    rm -f "$GRS_DIR/env.sh"
    return 0
}

# /etc/hosts is rewritten in place, never replaced: in a container it is a bind mount.
grs__hosts_remove() {
    local kept
    grep -qF "$GRS_HOSTS_TAG" /etc/hosts 2>/dev/null || return 0
    kept=$(grep -vF "$GRS_HOSTS_TAG" /etc/hosts || true)
    printf '%s\n' "$kept" >/etc/hosts
}

grs__hosts_add() {
    local kept k
    kept=$(grep -vF "$GRS_HOSTS_TAG" /etc/hosts || true)
    {
        printf '%s\n' "$kept"
        for ((k = 1; k <= GRS_NODES; k++)); do
            echo "$(grs_node_addr "$k") $(grs_node_name "$k") $GRS_HOSTS_TAG"
        done
    } >/etc/hosts
}

# ---- scaffolding for the integration scripts (tests/integ/slurm_*.sh) -------------------------

# Starts a test on the cluster: skips (exit 77) when a program named (relative to the build
# dir: $BUILD, else build/; a relative $BUILD is taken from the source tree's root) is not
# built or this machine cannot host the cluster; brings it up (up.sh: a clean one, whatever
# ran before) and sources its env file (SLURM_CONF...); sets GRS_BUILD and GRS_WORK, a scratch
# dir (under $TEST_TMPDIR when the test runner gives one); installs an EXIT trap that stops the
# cluster and removes the scratch dir (kept, and the logs' tails shown, when the test fails or
# $TEST_KEEP_TMPDIR is set).
#   grs_test_begin PROGRAM...
grs_test_begin() {
    local root p rc=0
    root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
    GRS_BUILD=${BUILD:-build}
    [[ $GRS_BUILD == /* ]] || GRS_BUILD=$root/$GRS_BUILD
    for p in "$@"; do
        if [ ! -x "$GRS_BUILD/$p" ]; then
            grs__skip "'$GRS_BUILD/$p' is not built"
            exit 77
        fi
    done
    trap grs_test_end EXIT
    # A signal ends the script through exit, so that the EXIT trap still stops the cluster.
    trap 'exit 129' HUP
    trap 'exit 130' INT
    trap 'exit 143' TERM
    "$root/tests/slurm/up.sh" || rc=$?
    [ "$rc" = 0 ] || exit "$rc"
    # shellcheck source=/dev/null
    . "$GRS_DIR/env.sh"
    GRS_WORK=$(mktemp -d "${TEST_TMPDIR:-${TMPDIR:-/tmp}}/gr-slurm-test.XXXXXX")
    echo "# scratch $GRS_WORK"
}

grs_test_end() {
    local rc=$? f
    trap - EXIT
    if [ "$rc" != 0 ] && [ "$rc" != 77 ]; then
        for f in "$GRS_DIR"/log/*.log ${GRS_WORK:+"$GRS_WORK"/*.out}; do
            [ -s "$f" ] || continue
            echo "# --- ${f##*/} (last 15 lines)"
            tail -n 15 "$f" | sed 's/^/# /'
        done
    fi
    grs_down
    if [ -n "${GRS_WORK:-}" ]; then
        if { [ "$rc" = 0 ] || [ "$rc" = 77 ]; } && [ -z "${TEST_KEEP_TMPDIR:-}" ]; then
            rm -rf "$GRS_WORK"
        else
            echo "# scratch kept: $GRS_WORK"
        fi
    fi
    exit "$rc"
}

# Ends the test as failed with a one-line reason.
grs_fail() {
    echo "FAIL: $*"
    exit 1
}

# Waits up to SECONDS for batch job JOBID to end (its state final, its nodes done with it)
# and prints that state (COMPLETED, FAILED, CANCELLED...); returns 1 at the deadline.
#   grs_job_wait JOBID SECONDS
grs_job_wait() {
    local id=$1 deadline line state
    deadline=$(($(grs_now_ms) + $2 * 1000))
    while [ "$(grs_now_ms)" -lt "$deadline" ]; do
        line=$(scontrol -o show job "$id" 2>/dev/null) || line=
        state=$(sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p' <<<"$line")
        # scontrol names a job whose nodes are still cleaning up COMPLETING, whatever
        # its final state will be.
        case $state in
        PENDING | RUNNING | SUSPENDED | CONFIGURING | COMPLETING | REQUEUED | RESIZING | "") ;;
        *)
            echo "$state"
            return 0
            ;;
        esac
        sleep 0.1
    done
    return 1
}

grs__main() {
    local cmd=${1:-} k
    [ $# -gt 0 ] && shift
    case $cmd in
    exec) grs_exec "$@" ;;
    env)
        [ -f "$GRS_DIR/env.sh" ] || {
            grs__err "no '$GRS_DIR/env.sh': the cluster is not up (tests/slurm/up.sh)"
            return 1
        }
        echo "$GRS_DIR/env.sh"
        ;;
    nodes)
        # What up.sh made, when it is up; else what it would make.
        if [ -f "$GRS_DIR/env.sh" ]; then
            # shellcheck source=/dev/null
            . "$GRS_DIR/env.sh"
            GRS_NODES=$GR_SLURM_NODES
            GRS_SUBNET=$GR_SLURM_SUBNET
        fi
        for ((k = 1; k <= GRS_NODES; k++)); do
            echo "$(grs_node_name "$k") $(grs_node_addr "$k")"
        done
        ;;
    *)
        sed -n '/^# Command line:/,/^#  *tests\/slurm\/lib.sh nodes/s/^# \{0,1\}//p' "$0" >&2
        return 2
        ;;
    esac
}

if [ "$GRS_MAIN" = 1 ]; then
    rc=0
    grs__main "$@" || rc=$?
    exit "$rc"
fi
