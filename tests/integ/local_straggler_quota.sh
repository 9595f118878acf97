#!/usr/bin/env bash
# Stragglers from a real CPU quota: 3 ranks run the same CPU-bound Python loop (pure Python
# arithmetic, ~30 ms of CPU a step, timed and reported as step_time), and rank 1 moves itself
# into a cgroup this script makes (cpu_quota.sh) with a quota of 10 ms of CPU every 100 ms
# (cgroup v1's cpu hierarchy, else cgroup v2's cpu.max). Its steps then take 3 to 5 times the
# others', also when other processes keep both CPUs of a 2-CPU machine busy. gpurun status,
# the log and summary.json name rank 1 and no other rank; the cgroup was throttled. With 3
# ranks the median is the slower of the two free ones, so load that makes those two unequal
# cannot get either named. Skips where no such cgroup can be made (not root, a read-only
# cgroup fs, no cpu controller). The cgroup is removed at exit, failure too: pids left in it
# go back first to the script's own cgroup of that hierarchy (else to its root).
# timeout: 60
set -euo pipefail
# shellcheck source=local_common.sh
. "$(dirname "$0")/local_common.sh"
# shellcheck source=cpu_quota.sh
. "$(dirname "$0")/cpu_quota.sh"

py=/usr/bin/python3
[ -x "$py" ] || py=python3
slow=1
# Seconds the ranks run: the quota'd rank is named after its 10th step (STRAGGLER_MIN_STEPS)
# at the leader's next check, a few seconds in even on a loaded machine.
duration=12
# The quota: microseconds of CPU a period.
quota_us=10000 period_us=100000

# --- the cgroup ----------------------------------------------------------------------------
exit_hooks+=(quota_remove)
quota_make "$quota_us" "$period_us" || skip "$QUOTA_WHY"
cg=$QUOTA_CG
echo "# cgroup with a quota of $quota_us us of CPU every $period_us us: $cg"

# --- the job -------------------------------------------------------------------------------
# Every rank: the same arithmetic each step (~30 ms of CPU unthrottled), timed and reported as
# step_time. Rank $slow first moves itself into the cgroup and says so in $work/entered.
cat >"$work/busy.py" <<EOF
import os, sys, time
sys.path.insert(0, "$root/lib/rank/python")
import gpurun
if gpurun.rank() == $slow:
    try:
        with open("$cg/cgroup.procs", "w") as f:
            f.write("%d\n" % os.getpid())
        note = "entered %d" % os.getpid()
    except OSError as e:
        note = "error %s" % e
    with open("$work/entered.tmp", "w") as f:
        f.write(note + "\n")
    os.rename("$work/entered.tmp", "$work/entered")
end = time.monotonic() + $duration
step = 0
while time.monotonic() < end:
    step += 1
    t0 = time.monotonic()
    x = 0
    for i in range(300000):
        x += i * i % 7
    gpurun.report(step, step_time=time.monotonic() - t0)
EOF

field() {
    "$py" -c 'import json, sys; d = json.load(open(sys.argv[1])); print(eval(sys.argv[2]))' \
        "$1/summary.json" "$2"
}

job=$work/job
timeout -k 5 50 "$gpurun" --local --gpus-per-node 3 --job-dir "$job" \
    -- "$py" "$work/busy.py" >"$work/out" 2>"$work/err" </dev/null &
gp=$!
bg_pids+=("$gp")
fail_show=(out err st)
seen='' inside=''
for ((i = 0; i < 200; i++)); do
    if [ -z "$inside" ] && [ -s "$work/entered" ]; then
        note=$(cat "$work/entered")
        case $note in
        "entered "*)
            quota_has "${note#entered }" ||
                fail "rank $slow (pid ${note#entered }) is not in '$cg': $(quota_pids)"
            inside=1
            ;;
        *) skip "rank $slow could not enter the cgroup: ${note#error }" ;;
        esac
    fi
    if "$gpurun" status --job-dir "$job" >"$work/st" 2>&1 &&
        grep -qE "^straggler: rank $slow on node 0 \(.*\) [0-9]+% slower than the median over" \
            "$work/st"; then
        seen=1
        break
    fi
    kill -0 "$gp" 2>/dev/null || break
    sleep 0.2
done
[ -n "$inside" ] || fail "rank $slow never said it entered the cgroup"
[ -n "$seen" ] || fail "gpurun status never named rank $slow: $(grep -i strag "$work/st")"
[ "$(grep -c '^straggler:' "$work/st")" = 1 ] ||
    fail "status names more than rank $slow: $(grep straggler "$work/st")"
echo "# status: $(grep '^straggler:' "$work/st")"
wait "$gp" || fail "the job failed: $(tail -n 5 "$work/err")"
grep -q "straggler: rank $slow on node 0 ('.*') [0-9]*% slower than the median" "$work/err" ||
    fail "no log line for the straggler: $(grep -i strag "$work/err")"
[ "$(grep -c 'straggler: rank' "$work/err")" = 1 ] ||
    fail "the log names more than rank $slow: $(grep 'straggler: rank' "$work/err")"
got=$(field "$job" "[s['rank'] for s in d.get('stragglers') or []]")
[ "$got" = "[$slow]" ] || fail "summary.json stragglers: $got, expected [$slow]"
# The kernel throttled the cgroup.
throttled=$(quota_throttled)
[ "$throttled" -gt 0 ] || fail "the cgroup was never throttled: $(cat "$cg/cpu.stat")"
echo "# log: $(grep -o 'straggler: rank.*' "$work/err"); throttled $throttled times"
echo "# summary.json: $(field "$job" "'%.0f%% slower over %d steps' % \
    (d['stragglers'][0]['slower'] * 100, d['stragglers'][0]['steps'])")"
