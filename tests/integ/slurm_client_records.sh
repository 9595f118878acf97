#!/bin/bash
# One truth on the Slurm test cluster: for each way a 2-node job can end badly, gpurun
# --wait's exit status, summary.json, 'gpurun status' and Slurm's own record agree, and the
# job ends soon, with no rendezvousd or rank left on any node. Rows: node 1's daemon SIGKILLed
# while the job runs; node 0's (the leader's) SIGKILLed; node 1's daemon dead before it
# joins (a wrapper kills itself on node 1) under --join-timeout 8 and a 2-minute limit.
# timeout: 240
# lane: side
set -euo pipefail
# shellcheck source=slurm_client_common.sh
. "$(dirname "$0")/slurm_client_common.sh"

# daemon_pid ID NODE: the pid of node NODE's rendezvousd of job ID (its SLURM_NODEID).
daemon_pid() {
    local p
    # The daemon's own command line starts with its path; srun's names it further on.
    for p in $(pgrep -f "^[^ ]*rendezvousd --job-dir $GPURUN_JOBS/$1 "); do
        if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "SLURM_NODEID=$2"; then
            echo "$p"
            return 0
        fi
    done
}

# A rendezvousd that dies before it joins on node 1 (the batch script's GPURUN_RENDEZVOUSD).
cat >dying-rendezvousd <<SH
#!/bin/sh
[ "\$SLURM_NODEID" = 1 ] && kill -KILL \$\$
exec "$GRS_BUILD/rendezvousd" "\$@"
SH
chmod +x dying-rendezvousd

# name action exit state outcome (- for no summary.json) cause
table=(
    "kill-node1 kill1 125 FAILED failed node 1 ('node2') lost"
    "kill-node0 kill0 125 FAILED - -"
    "join-death join 124 FAILED failed join timed out after 8000 ms; missing nodes: 1"
)

for row in "${table[@]}"; do
    read -r name action want_rc want_state want_outcome want_cause <<<"$row"
    extra=() envs=()
    if [ "$action" = join ]; then
        extra=(--join-timeout 8 -t 2)
        envs=("GPURUN_RENDEZVOUSD=$GRS_WORK/dying-rendezvousd")
    fi
    t0=$(grs_now_ms)
    rc=0
    # shellcheck disable=SC2016 # expanded by each rank
    env "${envs[@]}" timeout 150 "$gpurun" --wait -N 2 --gpus-per-node 1 --kill-grace 1 "${extra[@]}" \
    -- sh -c 'echo "up $RANK"; exec sleep 3009' >"$name.out" 2>"$name.err" </dev/null &
    gpid=$!
    id=
    for ((i = 0; i < 150; i++)); do
        id=$(job_id "$name.out")
        [ -n "$id" ] && break
        sleep 0.2
    done
    [ -n "$id" ] || grs_fail "$name: no job id: $(cat "$name.err")"
    case $action in
    kill0 | kill1)
        for ((i = 0; i < 150; i++)); do
            [ "$(grep -c '^\[[01]\] up' "$name.out")" = 2 ] && break
            sleep 0.2
        done
        victim=$(daemon_pid "$id" "${action#kill}")
        [ -n "$victim" ] || grs_fail "$name: no rendezvousd of node ${action#kill}"
        kill -KILL "$victim"
        ;;
    esac
    wait "$gpid" || rc=$?
    wait_rc=$rc
    elapsed=$(($(grs_now_ms) - t0))
    echo "# $name: --wait $rc after $elapsed ms"
    [ "$rc" = "$want_rc" ] || grs_fail "$name: --wait exit status $rc, expected $want_rc: $(tail -n 3 "$name.err"); summary: $(head -n 30 "$GPURUN_JOBS/$id/summary.json" 2>&1); script end: $(tail -n 12 "$GPURUN_JOBS/$id/job.sbatch")"
    [ "$elapsed" -lt 60000 ] || grs_fail "$name: took $elapsed ms"
    if pgrep -f '^sleep 3009$' >/dev/null || pgrep -f "rendezvousd --job-dir $GPURUN_JOBS/$id " >/dev/null; then
        grs_fail "$name: processes left: $(pgrep -af "sleep 3009|$GPURUN_JOBS/$id ")"
    fi
    run st.json st.err status "$id" --json
    expect_rc "$name: gpurun status --json" 0
    got=$(json st.json 'v["state"], v["exit_status"], v["slurm"]["state"]')
    [ "$got" = "('$want_state', $want_rc, '$want_state')" ] ||
        grs_fail "$name: status --json (state, exit status, Slurm's state) is $got, expected ('$want_state', $want_rc, '$want_state')"
    summary=$GPURUN_JOBS/$id/summary.json
    if [ "$want_outcome" = - ]; then
        [ ! -e "$summary" ] || grs_fail "$name: a summary.json, expected none (the leader was killed)"
    else
        [ -f "$summary" ] || grs_fail "$name: no summary.json"
        [ "$(json "$summary" 'v["outcome"], v["exit_status"]')" = "('$want_outcome', $want_rc)" ] ||
            grs_fail "$name: summary $(json "$summary" 'v["outcome"], v["exit_status"]'), expected ('$want_outcome', $want_rc)"
        [ "$(json "$summary" 'sum(r["phase"] == "running" for r in v["ranks"])')" = 0 ] ||
            grs_fail "$name: ranks still 'running' in the summary"
        json "$summary" 'v["first_failure"]["cause"]' | grep -qF "$want_cause" ||
            grs_fail "$name: cause '$(json "$summary" 'v["first_failure"]["cause"]')', expected '$want_cause'"
    fi
    echo "ok - $name: --wait $wait_rc, status $want_state, Slurm $want_state, summary $want_outcome"
done
