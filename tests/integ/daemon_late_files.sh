#!/usr/bin/env bash
# The batch script writes the key and job.json while srun starts the daemons: a rendezvousd
# that starts first waits for them. One started on a job dir that has neither yet runs its
# job once both are written 300 ms later (the key, then an empty job.json, then its text: an
# empty file is not read); one started on a dir that does not exist fails at once.
# timeout: 30
set -euo pipefail

# shellcheck source=prologue.sh
. "$(dirname "$0")/prologue.sh"
fail_show=('*.err')
need_built --hint "make all" rendezvousd
rdv=$build/rendezvousd

dir=$work/job
mkdir -m 0700 "$dir"
"$rdv" --job-dir "$dir" --node-rank 0 >"$work/n0.out" 2>"$work/n0.err" &
bg_pids=($!)
sleep 0.3
kill -0 "${bg_pids[0]}" || fail "rendezvousd did not wait for the key and job.json"
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$dir/key"
chmod 600 "$dir/key"
: >"$dir/job.json"
sleep 0.1
kill -0 "${bg_pids[0]}" || fail "rendezvousd read an empty job.json"
cat >"$dir/job.json" <<'JSON'
{"version": 1, "job_id": "late", "nnodes": 1, "nprocs": 2, "loopback": true,
 "argv": ["sh", "-c", "echo rank $RANK of $WORLD_SIZE"]}
JSON
status=0
wait "${bg_pids[0]}" || status=$?
bg_pids=()
[ "$status" = 0 ] || fail "exit status $status, want 0"
for r in 0 1; do
    grep -qx "rank $r of 2" "$dir/logs/rank-$r.log" || fail "rank $r's log: $(head -c 300 "$dir/logs/rank-$r.log")"
done

start=$(date +%s%3N)
status=0
"$rdv" --job-dir "$work/none" --node-rank 0 >"$work/none.out" 2>"$work/none.err" || status=$?
elapsed=$(($(date +%s%3N) - start))
[ "$status" != 0 ] || fail "rendezvousd ran without a job dir"
grep -q "job.json" "$work/none.err" || fail "no error naming job.json: $(cat "$work/none.err")"
[ "$elapsed" -lt 2000 ] || fail "a missing job dir failed after $elapsed ms, not at once"
echo "waited for the key and job.json written 300 ms late, then ran both ranks; no job dir: failed in $elapsed ms"
