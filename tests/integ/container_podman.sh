#!/usr/bin/env bash
# Ranks in containers with a real runtime: Podman from Debian (runc), an image this script
# builds from files of this machine (`podman import` of a root filesystem of a few links and
# /etc files; /usr comes in read-only through --container-mounts, Debian's torch with it), in
# a storage and a containers.conf of the test's own. Under `gpurun --local` with
# --container-image:
#   - 2 nodes x 2 ranks of a real torch gloo script meet through env:// inside their
#     containers (--require-rendezvous) and report to `gpurun status` through the rank socket
#     mounted in; the job completes and no container is left;
#   - a rank's process SIGKILLed inside its container: the job fails naming it, and nothing
#     is left: no container (running or stopped), no process of the job, no conmon; nor
#     when gpurun itself is SIGKILLed;
#   - a rank that hangs: --hang-timeout catches it, with its Python stack in summary.json;
#   - what cannot run is one line before any rank starts: an image that is not there, a
#     runtime not installed, a mount source that does not exist, an image without the job's
#     Python.
# The runtime's set-up and the image: container_common.sh.
# timeout: 300
set -euo pipefail
# shellcheck source=local_common.sh
. "$(dirname "$0")/local_common.sh"

py=/usr/bin/python3
"$py" -c 'import torch.distributed as d; assert d.is_gloo_available()' >/dev/null 2>&1 ||
    skip "'$py' has no torch with gloo (python3-torch)"
# shellcheck source=container_common.sh
. "$(dirname "$0")/container_common.sh"
exit_hooks+=(container_clean)
container_setup "$work"
image=("${CONTAINER_ARGS[@]}")

# A training loop: gloo through env://, an all_reduce a step, a report a step; STALL_RANK
# sleeps at step 5, STEPS bounds it.
cat >"$work/train.py" <<'EOF'
import os, sys, time
import torch, torch.distributed as dist
import gpurun
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
steps = int(os.environ.get("STEPS", "20"))
for step in range(1, steps + 1):
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == world
    gpurun.report(step=step, loss=1.0 / step)
    if os.environ.get("STALL_RANK") == str(rank) and step == 5:
        time.sleep(3600)
    time.sleep(0.05)
print("rank %d/%d in %s: %d steps, all_reduce %d, %s" % (
    rank, world, os.uname().nodename, steps, t.item(),
    open("/etc/gpurun-test-image").read().strip()), flush=True)
EOF
cd "$work"

# left JOB: what is left of job JOB: its containers (any state), the processes of its ranks
# (TORCHELASTIC_RUN_ID, which gpurun sets to the job id, in their environment) and the
# conmons of its containers (their names on the command line). "" when nothing.
left() {
    local job=$1 c p=
    c=$(podman ps --all --filter "label=gpurun.job=$job" --format '{{.Names}}' 2>/dev/null)
    for f in /proc/[0-9]*; do
        if tr '\0' '\n' 2>/dev/null <"$f/environ" | grep -qx "TORCHELASTIC_RUN_ID=$job" ||
            tr '\0' ' ' 2>/dev/null <"$f/cmdline" | grep -q "gpurun-$job-[n]"; then
            p+=" ${f#/proc/}($(tr '\0' ' ' 2>/dev/null <"$f/cmdline" | cut -c1-60))"
        fi
    done
    [ -z "$c$p" ] || echo "containers: $c; processes:$p"
}
job_of() {
    sed -n 's/^gpurun: job \([^,]*\), job dir .*$/\1/p' "$work/err"
}

# 1. 2 nodes x 2 ranks, together, reporting.
GPURUN_LIMIT=120 run --local --nodes 2 --gpus-per-node 2 "${image[@]}" --require-rendezvous \
    --job-dir "$work/j1" -- "$py" train.py
expect_rc 0 "torch gloo in containers"
for r in 0 1 2 3; do
    grep -q "^\[$r\] rank $r/4 in .*: 20 steps, all_reduce 4, gpurun test image$" "$work/out" ||
        fail "rank $r's line is missing: $(cat "$work/out")"
done
"$py" - "$work/j1/summary.json" <<'EOF' || fail "summary.json: the ranks' reports did not reach the leader"
import json, sys
s = json.load(open(sys.argv[1]))
assert s["ranks_met"] is True, s
assert all(r["reported"] and r["step"] == 20 for r in s["ranks"]), s["ranks"]
EOF
j1=$(job_of)
[ -z "$(left "$j1")" ] || fail "the job left: $(left "$j1")"
run status --job-dir "$work/j1" --json
"$py" -c '
import json, sys
st = json.load(open(sys.argv[1]))
p, ranks = st["progress"], st["summary"]["ranks"]
assert p["ranks"] == 4 and p["step_min"] == 20 and p["step_max"] == 20, p
assert sorted(r["rank"] for r in ranks) == [0, 1, 2, 3] and all(r["step"] == 20 for r in ranks), ranks
' "$work/out" || fail "gpurun status does not show the 4 ranks' 20 steps: $(head -c 600 "$work/out")"
echo "# 2x2 torch gloo ranks in podman containers met, reported 20 steps each; nothing left"
# gpurun rerun: the same job, container options and all, again.
GPURUN_LIMIT=120 run rerun "$j1"
expect_rc 0 "gpurun rerun of the container job"
grep -qF -- "--container-image localhost/gpurun-test:1 --container-mounts /usr:/usr:ro" "$work/err" ||
    fail "rerun's command line lacks the container options: $(head -n 3 "$work/err")"
[ "$(grep -c "^\[[0-3]\] rank [0-3]/4 in .*: 20 steps, all_reduce 4, gpurun test image$" "$work/out")" = 4 ] ||
    fail "the rerun's ranks did not all train: $(cat "$work/out")"

# 2. A rank's process killed inside its container.
STEPS=100000 timeout -k 5 120 "$gpurun" --local --nodes 2 --gpus-per-node 2 "${image[@]}" \
    --job-dir "$work/j2" -- "$py" train.py >"$work/out" 2>"$work/err" </dev/null &
pid=$!
bg_pids+=("$pid")
victim=
for ((i = 0; i < 300; i++)); do
    [ -z "$victim" ] || break
    sleep 0.1
    victim=$(podman ps --filter "label=gpurun.job=$(job_of)" --filter "name=-r2-" \
        --format '{{.Names}}' 2>/dev/null | head -n1)
done
# Under way: past its rendezvous, into the steps.
sleep 3
[ -n "$victim" ] || fail "rank 2's container never ran: $(cat "$work/err")"
vpid=$(podman inspect --format '{{.State.Pid}}' "$victim")
t0=$(date +%s%N)
kill -KILL "$vpid"
rc=0
wait "$pid" || rc=$?
echo "# rank 2 (pid $vpid in $victim) killed: gpurun ended $rc after $((($(date +%s%N) - t0) / 1000000)) ms"
if [ "$rc" = 0 ] || [ "$rc" = 124 ]; then
    fail "the job with a killed rank: exit $rc"
fi
grep -qE "rank 2 on node 1 \('[^']*'\) (was killed by signal 9 \(SIGKILL\)|exited with status 137)" "$work/err" ||
    fail "gpurun does not name rank 2's death: $(tail -n 5 "$work/err")"
sleep 1
[ -z "$(left "$(job_of)")" ] || fail "the failed job left: $(left "$(job_of)")"

# 2b. gpurun itself SIGKILLed: its daemons end the job, and with it every container.
STEPS=100000 "$gpurun" --local --nodes 2 --gpus-per-node 2 "${image[@]}" --job-dir "$work/j2b" \
    -- "$py" train.py >"$work/out" 2>"$work/err" </dev/null &
pid=$!
bg_pids+=("$pid")
for ((i = 0; i < 300; i++)); do
    [ "$(podman ps --filter "label=gpurun.job=$(job_of)" --format '{{.Names}}' 2>/dev/null |
        wc -l)" = 4 ] && break
    sleep 0.1
done
sleep 1
kill -KILL "$pid"
t0=$(date +%s%N)
{ wait "$pid"; } 2>/dev/null || true
for ((i = 0; i < 100; i++)); do
    [ -z "$(left "$(job_of)")" ] && break
    sleep 0.1
done
[ -z "$(left "$(job_of)")" ] || fail "10 s after gpurun's SIGKILL the job left: $(left "$(job_of)")"
echo "# gpurun SIGKILLed: nothing of its 4 containers left after $((($(date +%s%N) - t0) / 1000000)) ms"

# 3. A hang, caught with the hung rank's Python stack.
STALL_RANK=1 STEPS=1000 GPURUN_LIMIT=120 run --local --gpus-per-node 2 "${image[@]}" \
    --hang-timeout 3 --job-dir "$work/j3" -- "$py" train.py
expect_rc 124 "a hung rank in a container"
"$py" - "$work/j3/summary.json" <<'EOF' || fail "summary.json has no Python stack of the hung rank"
import json, sys
s = json.load(open(sys.argv[1]))
assert s["outcome"] == "hung", s["outcome"]
stack = [r for r in s["ranks"] if r["rank"] == 1][0].get("stack", "")
assert "train.py" in stack and "line 13" in stack, stack
EOF
[ -z "$(left "$(job_of)")" ] || fail "the hung job left: $(left "$(job_of)")"
echo "# a hung rank in a container: caught, its Python stack kept, nothing left"

# 4. What cannot run: one line, before any rank starts (exit 125, no rank log).
refused() {
    local what=$1 line=$2
    shift 2
    GPURUN_LIMIT=60 run --local --gpus-per-node 2 --job-dir "$work/j-$what" "$@"
    expect_rc 125 "$what"
    grep -qF -- "$line" "$work/err" || fail "$what: no '$line' in: $(cat "$work/err")"
    [ ! -s "$work/j-$what/logs/rank-0.log" ] || fail "$what: a rank started"
}
refused image "--container-image 'localhost/none:1': not on this node (podman: " \
    --container-image localhost/none:1 -- "$py" -c pass
absent=
for rt in apptainer enroot; do
    command -v "$rt" >/dev/null || { absent=$rt && break; }
done
if [ -n "$absent" ]; then
    refused runtime "--container-runtime $absent: '$absent' is not installed on this node (not on PATH)" \
        --container-runtime "$absent" "${image[@]}" -- "$py" -c pass
else
    echo "# apptainer and enroot are both installed: no runtime to miss"
fi
refused mount "--container-mounts: '$work/none' does not exist on this node" \
    --container-image localhost/gpurun-test:1 --container-mounts "/usr:/usr:ro,$work/none:/data" \
    -- "$py" -c pass
refused python "--container-image 'localhost/gpurun-test:1' cannot run the job's '$py' (exit status" \
    --container-image localhost/gpurun-test:1 -- "$py" -c pass
echo "# a missing image, runtime and mount source, and an image without the Python: one line each"
