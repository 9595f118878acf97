#!/bin/bash
# Stragglers from a real CPU quota on the Slurm test cluster: local_straggler_quota's job on 3
# nodes with a rank each (the same CPU-bound Python loop, ~30 ms of CPU a step, reported as
# step_time), rank 1, on node2, in a cgroup of 10 ms of CPU every 100 ms (cpu_quota.sh). A rank
# cannot enter it itself: each slurmd has a mount namespace of its own with an empty tmpfs at
# /sys/fs/cgroup (tests/slurm/README.md). So every rank writes its pid (the host's: the pid
# namespace is shared) into a file of the scratch dir, and this script writes rank 1's into the
# cgroup, then says so in another file, which rank 1 waits for before its first step. The
# other ranks start once rank 1 has made 10 steps, and rank 1 steps on until they are done, so
# that the leader never compares the two free ranks alone. gpurun status names rank 1 on node 1
# (node2) and no other rank, so does the leader's log, summary.json's stragglers is [1], and
# the cgroup was throttled. Skips where no such cgroup can be made; the cgroup is removed at
# exit, failure too, before the cluster goes down.
# timeout: 180
# lane: side
set -euo pipefail
# shellcheck source=slurm_client_common.sh
. "$(dirname "$0")/slurm_client_common.sh"
# shellcheck source=cpu_quota.sh
. "$here/cpu_quota.sh"

# At exit (failure too) the gpurun started below is stopped (SIGTERM cancels its job; its
# timeout's SIGKILL follows 5 s later), the cgroup goes (the pids left in it moved out), then
# the cluster: grs_test_begin's trap, grs_test_end, which takes the
# script's exit status from $?. `(exit RC) ||` hands it on, where errexit does not end the trap.
gp=''
on_exit() {
    local rc=$?
    if [ -n "$gp" ]; then
        kill "$gp" 2>/dev/null || true
        wait "$gp" 2>/dev/null || true
    fi
    quota_remove || true
    (exit "$rc") || grs_test_end
    grs_test_end
}
trap on_exit EXIT

slow=1
# Seconds the free ranks run their steps: the quota'd rank, 10 steps ahead, is named once they
# have made 10 steps, at the leader's next check (once a second).
duration=10
# The quota: microseconds of CPU a period.
quota_us=10000 period_us=100000

quota_make "$quota_us" "$period_us" || { echo "# SKIP $QUOTA_WHY" && exit 77; }
echo "# cgroup with a quota of $quota_us us of CPU every $period_us us: $QUOTA_CG"

# Every rank: its pid into pid-RANK, then the same arithmetic each step, timed and reported as
# step_time. The leader compares the ranks with 10 steps or more (STRAGGLER_MIN_STEPS), and the
# median of two is their mean: the two free ranks alone would get the slower one named where
# another process on this machine makes them unequal. So they never count alone: rank $slow
# waits for this script's word that it is in the cgroup ("entered"), says when it has made 10
# steps ("ten"), which the others wait for before their first, and steps on until both said
# they are done ("done-RANK"). Every file by tmp + rename: no reader sees half of one.
cat >busy.py <<EOF
import os, time
import gpurun
work = os.path.dirname(os.path.abspath(__file__))
rank = gpurun.rank()

def put(name, text):
    with open("%s/%s.tmp" % (work, name), "w") as f:
        f.write(text + "\n")
    os.rename("%s/%s.tmp" % (work, name), "%s/%s" % (work, name))

def there(*names):
    return all(os.path.exists("%s/%s" % (work, n)) for n in names)

def wait_for(name, seconds):
    deadline = time.monotonic() + seconds
    while not there(name) and time.monotonic() < deadline:
        time.sleep(0.05)

def step(n):
    t0 = time.monotonic()
    x = 0
    for i in range(300000):
        x += i * i % 7
    gpurun.report(n, step_time=time.monotonic() - t0)

put("pid-%d" % rank, "%d" % os.getpid())
n = 0
if rank == $slow:
    wait_for("entered", 30)
    others = ["done-%d" % r for r in range(gpurun.world_size()) if r != rank]
    cap = time.monotonic() + 90
    while (n < 10 or not there(*others)) and time.monotonic() < cap:
        n += 1
        step(n)
        if n == 10:
            put("ten", "")
else:
    wait_for("ten", 60)
    end = time.monotonic() + $duration
    while time.monotonic() < end:
        n += 1
        step(n)
    put("done-%d" % rank, "")
EOF

timeout -k 5 150 "$gpurun" --wait -N 3 --gpus-per-node 1 -- "$py" busy.py \
    >quota.out 2>quota.err </dev/null &
gp=$!
id='' inside='' seen=''
for ((i = 0; i < 600; i++)); do
    [ -n "$id" ] || id=$(job_id quota.out)
    if [ -z "$inside" ] && [ -s "pid-$slow" ]; then
        pid=$(cat "pid-$slow")
        grep -q busy.py "/proc/$pid/cmdline" 2>/dev/null ||
            grs_fail "rank $slow's pid $pid is not busy.py here: $(tr '\0' ' ' <"/proc/$pid/cmdline")"
        err=$(quota_enter "$pid" 2>&1) ||
            { echo "# SKIP rank $slow could not enter the cgroup: $err" && exit 77; }
        quota_has "$pid" || grs_fail "rank $slow (pid $pid) is not in '$QUOTA_CG': $(quota_pids)"
        echo "$pid" >entered.tmp
        mv entered.tmp entered
        inside=1
    fi
    if [ -n "$id" ] && "$gpurun" status "$id" >st.out 2>&1 &&
        grep -qE "^straggler: rank $slow on node 1 \(node2\) [0-9]+% slower than the median over" \
            st.out; then
        seen=1
        break
    fi
    kill -0 "$gp" 2>/dev/null || break
    sleep 0.2
done
[ -n "$id" ] || grs_fail "no job id: $(tail -n 5 quota.err)"
[ -n "$inside" ] || grs_fail "rank $slow never wrote its pid"
[ -n "$seen" ] || grs_fail "gpurun status never named rank $slow: $(grep -i strag st.out)"
[ "$(grep -c '^straggler:' st.out)" = 1 ] ||
    grs_fail "status names more than rank $slow: $(grep straggler st.out)"
echo "# status: $(grep '^straggler:' st.out)"
rc=0
wait "$gp" || rc=$?
gp=''
[ "$rc" = 0 ] || grs_fail "gpurun --wait exited $rc: $(tail -n 5 quota.err)"
log=$GPURUN_JOBS/$id.out
grep -q "straggler: rank $slow on node 1 ('node2') [0-9]*% slower than the median" "$log" ||
    grs_fail "no log line for the straggler: $(grep -i strag "$log")"
[ "$(grep -c 'straggler: rank' "$log")" = 1 ] ||
    grs_fail "the log names more than rank $slow: $(grep 'straggler: rank' "$log")"
summary=$GPURUN_JOBS/$id/summary.json
got=$(json "$summary" '[s["rank"] for s in v.get("stragglers") or []]')
[ "$got" = "[$slow]" ] || grs_fail "summary.json stragglers: $got, expected [$slow]"
throttled=$(quota_throttled)
[ "$throttled" -gt 0 ] || grs_fail "the cgroup was never throttled: $(cat "$QUOTA_CG/cpu.stat")"
echo "# log: $(grep -o 'straggler: rank.*' "$log"); throttled $throttled times"
got=$(json "$summary" '"%.0f%% slower over %d steps" % (v["stragglers"][0]["slower"] * 100,
    v["stragglers"][0]["steps"])')
echo "# summary.json: $got"
echo "ok - rank $slow under a CPU quota named the straggler on Slurm, and no other rank"
