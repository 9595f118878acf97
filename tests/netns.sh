#!/bin/bash
# Test nodes on one machine: a bridge in the root network namespace and N network namespaces,
# each with a veth into the bridge and its own address in a private /24 with no default
# route, so that traffic between "nodes" is real IP traffic that never leaves the box.
#
# Library (tests/integ/netns_*.sh):   . tests/netns.sh; netns_up 3 || exit $?; ...
# Command line:                       tests/netns.sh up 3; tests/netns.sh exec 1 ip addr; ...
#
#   up N             create nodes 0..N-1 (idempotent; prints "K NAMESPACE ADDRESS" per node)
#   down             kill every process inside the namespaces and everything spawned (by
#                    pid), delete the namespaces and the bridge (idempotent)
#   exec K CMD...    run CMD inside node K (nsenter --net, which, unlike 'ip netns exec',
#                    leaves /sys alone)
#   spawn [-e ERRLOG] K LOG CMD...  start CMD inside node K in the background, output to LOG
#                    (stderr to ERRLOG if given); the pid is recorded for 'down' (library:
#                    $NETNS_PID; command line: printed)
#   cut K / heal K   take node K's link down / up again (the host side of its veth)
#   addr K | name K | veth K | bridge | subnet    print what node K is called
#   check            exit 0 when namespaces can be made here, else 77 with the reason
#
# Everything is named from an id, so concurrent runs do not meet: namespaces gr<ID>n<K>, host
# veths gr<ID>v<K>, bridge gr<ID>b. The id is $GR_NETNS_ID, else the caller's pid ($$ of the
# sourcing script, the parent's pid on the command line). Addresses are <subnet>.<10+K>, the
# bridge <subnet>.1, where the subnet is $GR_NETNS_SUBNET (three octets, e.g. 10.213.7) or the
# first 10.213.X not routed here yet. State (subnet, node count, spawned pids) lives in
# $GR_NETNS_STATE, default ${TMPDIR:-/tmp}/gr-netns-<ID>. Needs root, ip(8) and nsenter(1).
#
# Skips: functions return 77 and print "# SKIP <reason>" on stdout; the command line exits 77.
#
# The library also has what the integration scripts share (each documented below):
# netns_wait and netns_now_ms; netns_job_write and netns_job_start (a job dir and one
# rendezvousd per node); netns_test_begin (the prologue, with fail) and netns_json.

# A library must not change the shell options of the script that sources it.
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    set -euo pipefail
    NETNS_MAIN=1
    netns__default_id=$PPID
else
    NETNS_MAIN=0
    netns__default_id=$$
fi

NETNS_ID=${GR_NETNS_ID:-$netns__default_id}
NETNS_STATE=${GR_NETNS_STATE:-${TMPDIR:-/tmp}/gr-netns-$NETNS_ID}
NETNS_BRIDGE=gr${NETNS_ID}b
# Results for the sourcing script: the pid netns_spawn started, the status netns_wait got,
# the daemons netns_job_start started.
NETNS_PID=
NETNS_DAEMONS=()

netns__err() {
    echo "netns: $*" >&2
}

netns__skip() {
    echo "# SKIP $*"
    return 77
}

netns_name() { echo "gr${NETNS_ID}n$1"; }
netns_veth() { echo "gr${NETNS_ID}v$1"; }
netns_subnet() { cat "$NETNS_STATE/subnet"; }
netns_addr() { echo "$(netns_subnet).$((10 + $1))"; }
netns_count() { cat "$NETNS_STATE/nodes" 2>/dev/null || echo 0; }

# Returns 0 when this machine can host test nodes, or 77 with the reason.
netns_check() {
    local probe
    # An id becomes part of interface names, which Linux limits to 15 bytes.
    if ! [[ $NETNS_ID =~ ^[A-Za-z0-9]{1,8}$ ]]; then
        netns__err "id '$NETNS_ID' must be 1 to 8 letters or digits"
        return 2
    fi
    [ "$(id -u)" = 0 ] || {
        netns__skip "network namespaces need root"
        return
    }
    command -v ip >/dev/null || {
        netns__skip "no ip(8) (iproute2)"
        return
    }
    command -v nsenter >/dev/null || {
        netns__skip "no nsenter(1) (util-linux)"
        return
    }
    probe=gr${NETNS_ID}probe
    if ! ip netns add "$probe" 2>/dev/null; then
        netns__skip "cannot create a network namespace here ('ip netns add' failed)"
        return
    fi
    ip netns del "$probe" 2>/dev/null || true
    return 0
}

# The first 10.213.X.0/24 that no interface or route here uses yet, starting from one that
# depends on the id so that parallel runs rarely even try the same one.
netns__pick_subnet() {
    local x i
    for ((i = 0; i < 250; i++)); do
        x=$(((NETNS_ID_NUM + i) % 250 + 1))
        if ! ip -4 route show to match "10.213.$x.1" 2>/dev/null | grep -qv '^default' &&
            [ -z "$(ip -4 addr show to "10.213.$x.0/24" 2>/dev/null)" ]; then
            echo "10.213.$x"
            return 0
        fi
    done
    netns__err "no free subnet in 10.213.0.0/16; set GR_NETNS_SUBNET"
    return 1
}

# Creates the bridge and nodes 0..N-1. Calling it again with the same N is a no-op; with
# another N it starts over.
netns_up() {
    local n=${1:-}
    local k ns veth subnet rc=0
    if ! [[ $n =~ ^[0-9]+$ ]] || [ "$n" -lt 1 ] || [ "$n" -gt 200 ]; then
        netns__err "usage: up N (1..200 nodes)"
        return 2
    fi
    netns_check || return
    if [ -f "$NETNS_STATE/nodes" ]; then
        if [ "$(netns_count)" = "$n" ] && [ -e "/run/netns/$(netns_name $((n - 1)))" ]; then
            return 0
        fi
        netns_down
    fi
    mkdir -p "$NETNS_STATE"
    : >"$NETNS_STATE/pids"
    NETNS_ID_NUM=$(cksum <<<"$NETNS_ID" | cut -d' ' -f1)
    subnet=${GR_NETNS_SUBNET:-$(netns__pick_subnet)} || return 1
    if ! [[ $subnet =~ ^[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}$ ]]; then
        netns__err "GR_NETNS_SUBNET '$subnet' must be three octets, like 10.213.7"
        return 2
    fi
    echo "$subnet" >"$NETNS_STATE/subnet"
    echo "$n" >"$NETNS_STATE/nodes"
    {
        ip link add "$NETNS_BRIDGE" type bridge &&
            ip addr add "$subnet.1/24" dev "$NETNS_BRIDGE" &&
            ip link set "$NETNS_BRIDGE" up
    } || rc=1
    for ((k = 0; k < n && rc == 0; k++)); do
        ns=$(netns_name "$k")
        veth=$(netns_veth "$k")
        {
            ip netns add "$ns" &&
                ip link add "$veth" type veth peer name eth0 netns "$ns" &&
                ip link set "$veth" master "$NETNS_BRIDGE" &&
                ip link set "$veth" up &&
                ip -n "$ns" addr add "$subnet.$((10 + k))/24" dev eth0 &&
                ip -n "$ns" link set eth0 up &&
                ip -n "$ns" link set lo up
        } || rc=1
        # A closed socket whose peer went silent (a cut link) retransmits for minutes and
        # keeps its namespace, and the veth in it, alive after 'ip netns del'; let such
        # orphans give up after one retry. (down also destroys them, where the kernel can.)
        [ "$rc" = 0 ] && nsenter --net="/run/netns/$ns" -- \
            sh -c 'echo 1 >/proc/sys/net/ipv4/tcp_orphan_retries' 2>/dev/null
    done
    if [ "$rc" != 0 ]; then
        netns__err "cannot create node $((k - 1)) of $n; removing what was made"
        netns_down
        return 1
    fi
    return 0
}

# True while PID runs: a zombie (exited, not yet reaped) counts as gone.
netns__alive() {
    local stat
    stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
    stat=${stat##*) }
    [ "${stat%% *}" != Z ]
}

# A process's start time, so that a recorded pid is never mistaken for a later process that
# got the same number.
netns__start() {
    local stat
    stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 0
    stat=${stat##*) }
    echo "$stat" | cut -d' ' -f20
}

# Pids of every process inside our namespaces plus those spawned (which may have left).
netns__pids() {
    local ns pid
    for ns in /run/netns/gr"${NETNS_ID}"n*; do
        [ -e "$ns" ] && ip netns pids "$(basename "$ns")" 2>/dev/null
    done
    if [ -f "$NETNS_STATE/pids" ]; then
        while read -r pid start; do
            netns__alive "$pid" && [ "$(netns__start "$pid")" = "$start" ] && echo "$pid"
        done <"$NETNS_STATE/pids"
    fi
    return 0
}

# Removes everything this id created, by name, after killing what runs inside (by pid).
netns_down() {
    local pids ns i
    for ((i = 0; i < 50; i++)); do
        pids=$(netns__pids | sort -u)
        [ -z "$pids" ] && break
        # shellcheck disable=SC2086 # a list of pids
        kill -KILL $pids 2>/dev/null || true
        sleep 0.1
    done
    [ -n "$pids" ] && netns__err "processes still running after SIGKILL: ${pids//$'\n'/ }"
    for ns in /run/netns/gr"${NETNS_ID}"n*; do
        [ -e "$ns" ] || continue
        # Sockets that outlive their processes (FIN-WAIT towards a cut-off node) would keep
        # the namespace alive: destroy them (SOCK_DESTROY; a no-op where unsupported).
        nsenter --net="$ns" -- ss -K -ta >/dev/null 2>&1 || true
        ip netns del "$(basename "$ns")" 2>/dev/null
    done
    if ip link show "$NETNS_BRIDGE" >/dev/null 2>&1; then
        ip link del "$NETNS_BRIDGE" 2>/dev/null || true
    fi
    # A namespace's veth goes away a moment after the namespace; wait so that an 'up' right
    # after this one finds the names free.
    for ((i = 0; i < 50; i++)); do
        ip -o link show 2>/dev/null | grep -q " gr${NETNS_ID}[vb][0-9]*[@:]" || break
        sleep 0.05
    done
    [ "$i" -lt 50 ] || netns__err "links of deleted namespaces still present (held by the kernel):" \
        "$(ip -o link show | grep -o " gr${NETNS_ID}[vb][0-9]*" | tr -d '\n')"
    rm -rf "$NETNS_STATE"
    return 0
}

netns__node() {
    if ! [[ ${1:-} =~ ^[0-9]+$ ]] || [ "$1" -ge "$(netns_count)" ]; then
        netns__err "no node '${1:-}' (nodes: 0..$(($(netns_count) - 1)); is it up?)"
        return 2
    fi
}

# Runs a command inside node K, in the foreground.
netns_exec() {
    netns__node "${1:-}" || return
    local ns
    ns=$(netns_name "$1")
    shift
    nsenter --net="/run/netns/$ns" -- "$@"
}

# Starts a command inside node K in the background with its output in LOG (stderr too, unless
# -e ERRLOG names another file); sets NETNS_PID (nsenter execs the command, so this is the
# command's own pid, a child of this shell) and records it for down.
netns_spawn() {
    local err=
    if [ "${1:-}" = -e ]; then
        err=$2
        shift 2
    fi
    netns__node "${1:-}" || return
    local ns log=$2
    ns=$(netns_name "$1")
    shift 2
    nsenter --net="/run/netns/$ns" -- "$@" >"$log" 2>"${err:-$log}" &
    NETNS_PID=$!
    echo "$NETNS_PID $(netns__start "$NETNS_PID")" >>"$NETNS_STATE/pids"
}

# Waits up to MS milliseconds for PID, a child of this shell, to exit. Returns 0 and sets
# NETNS_STATUS to its exit status, or returns 1 while it still runs.
netns_wait() {
    local pid=$1 deadline
    deadline=$(($(netns_now_ms) + $2))
    while netns__alive "$pid"; do
        [ "$(netns_now_ms)" -ge "$deadline" ] && return 1
        sleep 0.01
    done
    # shellcheck disable=SC2034 # read by the sourcing script
    NETNS_STATUS=0
    # shellcheck disable=SC2034
    wait "$pid" || NETNS_STATUS=$?
    return 0
}

netns_now_ms() {
    local ns
    ns=$(date +%s%N)
    echo $((ns / 1000000))
}

# Takes node K's link down (or up): the host end of its veth, so that the node's packets
# go nowhere and nothing tells either side, as when a cable or switch port dies.
netns_cut() {
    netns__node "${1:-}" || return
    ip link set "$(netns_veth "$1")" down
}

netns_heal() {
    netns__node "${1:-}" || return
    ip link set "$(netns_veth "$1")" up
}

# ---- rendezvousd jobs on the nodes (used by tests/integ/netns_*.sh) -------------------------

# Prints S as a JSON string.
netns_json_str() {
    local s=$1
    s=${s//\\/\\\\}
    s=${s//\"/\\\"}
    s=${s//$'\n'/\\n}
    s=${s//$'\t'/\\t}
    printf '"%s"' "$s"
}

# Makes job dir DIR (0700) as the client would: DIR/job.json for NNODES nodes of NPROCS ranks
# running ARGV, not loopback, with MEMBERS (more '"key": value' pairs, comma-separated, may be
# empty) added, and DIR/key, 32 random bytes as 64 hex digits and a newline, mode 0600.
#   netns_job_write DIR NNODES NPROCS MEMBERS ARGV...
netns_job_write() {
    local dir=$1 nnodes=$2 nprocs=$3 members=$4 argv='' a
    shift 4
    for a in "$@"; do
        argv+=${argv:+, }$(netns_json_str "$a")
    done
    { mkdir -p "$dir" && chmod 0700 "$dir"; } || return
    cat >"$dir/job.json" <<EOF || return
{
  "version": 1,
  "job_id": $(netns_json_str "$(basename "$dir")"),
  "nnodes": $nnodes,
  "nprocs": $nprocs,
  "argv": [$argv],
  "loopback": false${members:+,
  $members}
}
EOF
    chmod 0600 "$dir/job.json" || return
    (
        umask 077
        head -c 32 /dev/urandom | od -An -v -tx1 | tr -d ' \n' >"$dir/key" && echo >>"$dir/key"
    )
}

# Starts one rendezvousd per node for job dir DIR: node K's binds and advertises its own
# address, names itself nodeK, and writes its stdout (the ranks' merged output) to
# OUT/nodeK.out and its stderr (its own log) to OUT/nodeK.err. The followers find the
# leader through DIR/endpoint.json. Sets NETNS_DAEMONS to the daemons' pids, by node.
#   netns_job_start DIR OUT RENDEZVOUSD [MORE DAEMON ARGS...]
netns_job_start() {
    local dir=$1 out=$2 bin=$3 k addr
    shift 3
    NETNS_DAEMONS=()
    for ((k = 0; k < $(netns_count); k++)); do
        addr=$(netns_addr "$k")
        netns_spawn -e "$out/node$k.err" "$k" "$out/node$k.out" "$bin" --job-dir "$dir" \
            --node-rank "$k" --bind "$addr" --advertise "$addr" --hostname "node$k" "$@" ||
            return
        # shellcheck disable=SC2034 # read by the sourcing script
        NETNS_DAEMONS[k]=$NETNS_PID
    done
}

# ---- scaffolding for the integration scripts ---------------------------------------------------

# Starts a test on N nodes with the integration scripts' prologue (tests/integ/prologue.sh:
# root, build, work, skip, fail...): skips (exit 77) when a program named (relative to the
# build dir) is not built or this machine cannot make the nodes; sets NETNS_BUILD (the build
# dir) and NETNS_WORK (the scratch dir); at exit the nodes and everything running in them go
# first, then the scratch dir (kept, and the tails of its *.out and *.err shown, when the test
# fails or $TEST_KEEP_TMPDIR is set).
#   netns_test_begin N PROGRAM...
netns_test_begin() {
    local n=$1 rc=0
    shift
    # shellcheck source=integ/prologue.sh
    . "$(dirname "${BASH_SOURCE[0]}")/integ/prologue.sh"
    fail_show=('*.out' '*.err')
    show_lines=20
    need_built "$@"
    command -v python3 >/dev/null || skip "no python3 to read the daemons' JSON files"
    exit_hooks+=(netns_down)
    # shellcheck disable=SC2034 # read by the sourcing script
    NETNS_BUILD=$build
    NETNS_WORK=$work
    netns_up "$n" || rc=$?
    [ "$rc" = 0 ] || exit "$rc"
    echo "# nodes: $(netns_name 0)..$(netns_name $((n - 1))) in $(netns_subnet).0/24, scratch $NETNS_WORK"
}

# Prints what the Python expression EXPR gives for j, the JSON document in FILE (a string as
# is, anything else as JSON, None as "null").
#   netns_json FILE EXPR
netns_json() {
    python3 -c '
import json, sys
j = json.load(open(sys.argv[1]))
v = eval(sys.argv[2], {"j": j})
print(v if isinstance(v, str) else json.dumps(v))' "$1" "$2"
}

netns__main() {
    local cmd=${1:-}
    [ $# -gt 0 ] && shift
    case $cmd in
    up)
        netns_up "$@" || return
        local k
        for ((k = 0; k < $1; k++)); do
            echo "$k $(netns_name "$k") $(netns_addr "$k")"
        done
        ;;
    down) netns_down ;;
    check) netns_check ;;
    exec) netns_exec "$@" ;;
    spawn)
        netns_spawn "$@" || return
        echo "$NETNS_PID"
        ;;
    cut) netns_cut "$@" ;;
    heal) netns_heal "$@" ;;
    addr) netns__node "${1:-}" && netns_addr "$1" ;;
    name) netns__node "${1:-}" && netns_name "$1" ;;
    veth) netns__node "${1:-}" && netns_veth "$1" ;;
    bridge) echo "$NETNS_BRIDGE" ;;
    subnet) netns_subnet ;;
    *)
        sed -n '/^#   up N/,/^#   check/s/^# \{0,1\}//p' "$0" >&2
        return 2
        ;;
    esac
}

if [ "$NETNS_MAIN" = 1 ]; then
    rc=0
    netns__main "$@" || rc=$?
    exit "$rc"
fi
