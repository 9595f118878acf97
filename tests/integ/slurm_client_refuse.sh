#!/bin/bash
# What gpurun refuses on the Slurm test cluster, each with one clear line on stderr, exit 125
# and nothing submitted: 0 nodes, an unknown partition, a malformed time, more nodes or GPUs
# than the cluster has, a command that does not exist (127). Then without Slurm: a missing
# slurm.conf, and slurmctld stopped, each said in one line within seconds.
# timeout: 90
# lane: side
set -euo pipefail
# shellcheck source=slurm_client_common.sh
. "$(dirname "$0")/slurm_client_common.sh"

# refused WANT_RC MESSAGE ARGS...: gpurun ARGS fails with WANT_RC and one line, MESSAGE.
refused() {
    local want=$1 msg=$2
    shift 2
    run out err "$@"
    expect_rc "gpurun $*" "$want"
    [ "$(wc -l <err)" = 1 ] || grs_fail "gpurun $*: not one line on stderr: $(cat err)"
    grep -qxF "gpurun: $msg" err || grs_fail "gpurun $*: said '$(cat err)', not '$msg'"
    [ ! -s out ] || grs_fail "gpurun $*: printed '$(cat out)'"
}

refused 125 "--nodes: must be 1..65536" -N 0 -- true
refused 125 "unknown partition 'nope'; nothing submitted" -p nope -N 2 -- true
refused 125 "--time: '1:2:3:4' is not a time (minutes, MM:SS, HH:MM:SS or D-HH[:MM[:SS]])" \
    -t 1:2:3:4 -- true
refused 125 "--time: 'soon' is not a time (minutes, MM:SS, HH:MM:SS or D-HH[:MM[:SS]])" \
    --time soon -- true
refused 125 "Slurm cannot give $((GR_SLURM_NODES + 1)) nodes with 1 GPU and 1 CPU each (--cpus-per-gpu 1 x 1 rank) (requested node configuration is not available); nothing submitted" \
    -N $((GR_SLURM_NODES + 1)) -- true
refused 125 "Slurm cannot give 1 node with $((GR_SLURM_GPUS + 1)) GPUs and $((GR_SLURM_GPUS + 1)) CPUs each (--cpus-per-gpu 1 x $((GR_SLURM_GPUS + 1)) ranks) (requested node configuration is not available); nothing submitted" \
    --gpus-per-node $((GR_SLURM_GPUS + 1)) -- true
refused 127 "'no-such-program-here': command not found" -N 2 -- no-such-program-here
out=$(scontrol -o show jobs 2>&1)
[[ $out == "No jobs in the system" ]] || grs_fail "jobs after the refusals: $out"

# No configuration: one line at once, libslurm never asked.
t0=$(grs_now_ms)
SLURM_CONF=$GRS_WORK/none.conf refused 125 \
    "no Slurm configuration: SLURM_CONF names '$GRS_WORK/none.conf', which does not exist" -- true
SLURM_CONF=$GRS_WORK/none.conf refused 125 \
    "no Slurm configuration: SLURM_CONF names '$GRS_WORK/none.conf', which does not exist" status 7
echo "# no_conf_ms=$(($(grs_now_ms) - t0))"

# slurmctld stopped: submit, status and cancel each say so in one line, within seconds.
ctld=$(grs_pidfile "$GRS_DIR/run/slurmctld.pid" slurmctld)
[ -n "$ctld" ] || grs_fail "no slurmctld pid"
kill "$ctld"
for ((i = 0; i < 100; i++)); do
    grs_alive "$ctld" || break
    sleep 0.05
done
for args in "-- true" "status 7" "cancel 7"; do
    t0=$(grs_now_ms)
    # shellcheck disable=SC2086 # the words of args
    run out err $args
    ms=$(($(grs_now_ms) - t0))
    echo "# ctld_down_ms($args)=$ms"
    expect_rc "gpurun $args with slurmctld down" 125
    [ "$(wc -l <err)" = 1 ] || grs_fail "gpurun $args with slurmctld down: $(cat err)"
    grep -qE "^gpurun: (cannot reach slurmctld|slurmctld did not answer)" err ||
        grs_fail "gpurun $args with slurmctld down said: $(cat err)"
    [ "$ms" -lt 5000 ] || grs_fail "gpurun $args took $ms ms to say slurmctld is down"
done
echo "# refusals: one line each, nothing submitted; no slurm.conf, no slurmctld: one line each"
