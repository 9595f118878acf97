# Shared by the tests/integ/*_straggler_quota.sh scripts (sourced, not run): a cgroup with a
# CPU quota, in cgroup v1's cpu hierarchy, else in cgroup v2 (cpu.max), for a rank to be
# slowed by. Needs root and a writable cgroup fs with the cpu controller.
#   quota_make QUOTA_US PERIOD_US   makes the cgroup (QUOTA_US microseconds of CPU every
#                    PERIOD_US), and a process can enter it: sets QUOTA_CG, its dir. Else
#                    returns 1 with why in QUOTA_WHY (for "# SKIP"), no cgroup left behind.
#   quota_enter PID  writes PID (any process of this machine's pid namespace) into it; the
#                    kernel's error on stderr, and a status, when it cannot
#   quota_has PID    whether PID is in it
#   quota_pids       the pids in it, on one line
#   quota_throttled  how many times the kernel throttled it (cpu.stat's nr_throttled)
#   quota_remove     moves the pids left in it back to the script's own cgroup of that
#                    hierarchy (else its root), then removes it; nothing when there is none.
#                    For the exit hooks or the EXIT trap: at exit, failure too.
# The caller registers quota_remove for exit before quota_make (a signal may come between).
# shellcheck shell=bash

QUOTA_CG='' QUOTA_WHY=''
# Where the pids left in $QUOTA_CG go back to.
quota__home=''

# quota__mkdir TOP CONTROLLERS: makes $QUOTA_CG under TOP (a hierarchy's mount point) and sets
# quota__home, the cgroup this script is in there (CONTROLLERS: the hierarchy's field in
# /proc/self/cgroup), else TOP itself: its root. Fails when TOP is not writable.
quota__mkdir() {
    local path
    path=$(awk -F: -v c="$2" '$2 == c { print $3; exit }' /proc/self/cgroup)
    quota__home=$1${path%/}
    [ -n "$path" ] && [ -f "$quota__home/cgroup.procs" ] || quota__home=$1
    QUOTA_CG=$1/gpurun-test-quota-$$
    mkdir "$QUOTA_CG" 2>/dev/null && return 0
    QUOTA_CG=''
    return 1
}

# quota__v1 TOP QUOTA_US PERIOD_US / quota__v2 ...: $QUOTA_CG under TOP with its quota, or
# why in $QUOTA_WHY.
quota__v1() {
    local ctl
    ctl=$(awk -F: '$2 ~ /(^|,)cpu(,|$)/ { print $2; exit }' /proc/self/cgroup)
    [ -f "$1/cpu.cfs_quota_us" ] || { QUOTA_WHY="no cpu.cfs_quota_us in '$1'" && return 1; }
    quota__mkdir "$1" "${ctl:--}" || { QUOTA_WHY="cannot make a cgroup under '$1'" && return 1; }
    {
        echo "$3" >"$QUOTA_CG/cpu.cfs_period_us" && echo "$2" >"$QUOTA_CG/cpu.cfs_quota_us"
    } 2>/dev/null ||
        { QUOTA_WHY="cannot set cpu.cfs_quota_us in '$QUOTA_CG'" && return 1; }
}
quota__v2() {
    grep -qw cpu "$1/cgroup.controllers" 2>/dev/null ||
        { QUOTA_WHY="no cpu controller in cgroup v2 ('$1')" && return 1; }
    grep -qw cpu "$1/cgroup.subtree_control" ||
        { QUOTA_WHY="cpu is not in '$1/cgroup.subtree_control'" && return 1; }
    quota__mkdir "$1" "" || { QUOTA_WHY="cannot make a cgroup under '$1'" && return 1; }
    { echo "$2 $3" >"$QUOTA_CG/cpu.max"; } 2>/dev/null ||
        { QUOTA_WHY="cannot write cpu.max in '$QUOTA_CG'" && return 1; }
}

quota_make() {
    local v1='' v2='' mnt type opts why1
    QUOTA_WHY=''
    while read -r _ mnt type opts _; do
        case $type in
        cgroup) [[ -z $v1 && ,$opts, == *,cpu,* ]] && v1=$mnt ;;
        cgroup2) [ -n "$v2" ] || v2=$mnt ;;
        esac
    done </proc/mounts

    QUOTA_WHY="no cgroup v1 cpu hierarchy nor cgroup v2 mounted"
    if [ -n "$v1" ] && quota__v1 "$v1" "$1" "$2"; then
        QUOTA_WHY=''
    elif [ -n "$v2" ]; then
        # A cgroup made but left without a quota goes before cgroup v2 is tried.
        quota_remove
        QUOTA_CG='' why1=${v1:+$QUOTA_WHY; }
        if quota__v2 "$v2" "$1" "$2"; then
            QUOTA_WHY=''
        else
            QUOTA_WHY=$why1$QUOTA_WHY
        fi
    fi
    # A process must be able to enter it: a subshell tries, and leaves it empty as it exits.
    if [ -z "$QUOTA_WHY" ] && ! (quota_enter "$BASHPID") 2>/dev/null; then
        QUOTA_WHY="cannot move a process into '$QUOTA_CG'"
    fi
    [ -z "$QUOTA_WHY" ] && return 0
    quota_remove
    QUOTA_CG=''
    return 1
}

quota_enter() {
    echo "$1" >"$QUOTA_CG/cgroup.procs"
}

quota_has() {
    grep -qx "$1" "$QUOTA_CG/cgroup.procs"
}

quota_pids() {
    tr '\n' ' ' <"$QUOTA_CG/cgroup.procs"
}

# Both v1 and v2 count nr_throttled in cpu.stat.
quota_throttled() {
    local n
    n=$(sed -n 's/^nr_throttled //p' "$QUOTA_CG/cpu.stat")
    echo "${n:-0}"
}

quota_remove() {
    local i p
    [ -n "$QUOTA_CG" ] && [ -d "$QUOTA_CG" ] || return 0
    for ((i = 0; i < 50; i++)); do
        while read -r p; do
            echo "$p" >"$quota__home/cgroup.procs" 2>/dev/null || true
        done <"$QUOTA_CG/cgroup.procs"
        rmdir "$QUOTA_CG" 2>/dev/null && return 0
        sleep 0.1
    done
    echo "# could not remove the cgroup '$QUOTA_CG'"
}
