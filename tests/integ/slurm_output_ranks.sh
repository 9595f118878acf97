#!/bin/bash
# The merged output on the Slurm test cluster: --output-ranks 1,3 shows only ranks 1 and 3 in
# the batch output file (and so in --wait's stream), while every rank's log is whole; a '\r'
# bar whose state waits reaches the batch output file at once, not at the next state;
# gpurun --wait on a terminal gives the ranks its width less their label as COLUMNS.
# timeout: 120
# lane: side
set -euo pipefail
# shellcheck source=slurm_client_common.sh
. "$(dirname "$0")/slurm_client_common.sh"

# Each rank says who it is on both streams; rank 1 then draws a bar state, waits 4 s, and
# draws the next.
# shellcheck disable=SC2016 # expanded by each rank
timeout 100 "$gpurun" --wait -N 2 --gpus-per-node 2 --output-ranks 1,3 -- sh -c \
    'echo "out $RANK"; echo "err $RANK" >&2
     if [ "$RANK" = 1 ]; then printf "\rstep-1"; sleep 4; printf "\rstep-2\n"; fi' \
    >wait.out 2>wait.err </dev/null &
gp=$!
id=
for ((i = 0; i < 300; i++)); do
    id=$(job_id wait.out)
    [ -n "$id" ] && [ -s "$GPURUN_JOBS/$id/logs/rank-1.log" ] &&
        grep -qF step-1 "$GPURUN_JOBS/$id/logs/rank-1.log" && break
    sleep 0.1
done
[ -n "$id" ] || grs_fail "no job id in 30 s: $(cat wait.out wait.err)"
grep -qF step-1 "$GPURUN_JOBS/$id/logs/rank-1.log" || grs_fail "rank 1 drew nothing in 30 s"
t0=$(grs_now_ms)
out=$GPURUN_JOBS/$id.out
until grep -qxF '[1] step-1' "$out" 2>/dev/null; do
    # Well before the next state (4 s), with room for a loaded machine: 0.3 s is usual.
    [ $(($(grs_now_ms) - t0)) -lt 2500 ] ||
        grs_fail "the bar's state was not in the batch output within 2.5 s: $(cat "$out" 2>/dev/null)"
    sleep 0.05
done
echo "# a waiting bar state: in the batch output file after $(($(grs_now_ms) - t0)) ms"
rc=0
wait "$gp" || rc=$?
expect_rc "gpurun --wait --output-ranks 1,3" 0

# Only ranks 1 and 3, each state once.
for f in "$out" wait.out; do
    for want in '[1] out 1' '[3] out 3' '[1] step-1' '[1] step-2'; do
        [ "$(grep -cxF "$want" "$f")" = 1 ] || grs_fail "$f: '$want' not once: $(cat "$f")"
    done
    ! grep -q '^\[[02]\]' "$f" || grs_fail "$f shows ranks left out: $(grep '^\[[02]\]' "$f")"
done
grep -qxF '[3] err 3' "$out" || grs_fail "the batch output lacks rank 3's stderr: $(cat "$out")"
! grep -q '^\[[02]\] err' "$out" || grs_fail "the batch output shows a left-out rank's stderr"
# Every rank's log whole.
for r in 0 1 2 3; do
    grep -qxF "out $r" "$GPURUN_JOBS/$id/logs/rank-$r.log" ||
        grs_fail "rank $r's log lacks its line: $(cat "$GPURUN_JOBS/$id/logs/rank-$r.log")"
done
grep -qF '"output_ranks": "1,3"' "$GPURUN_JOBS/$id/job.json" || grs_fail "job.json lacks output_ranks"
echo "# --output-ranks 1,3 on Slurm: those ranks' lines only, every log whole"

# gpurun --wait on a terminal (a pseudo-terminal 100 columns wide): the ranks get its width less
# their label as COLUMNS, though their daemons write to the batch output file.
# shellcheck disable=SC2016 # expanded by each rank
timeout 100 "$py" - "$gpurun" --wait -N 2 -- sh -c 'echo "cols ${COLUMNS-unset}"' >pty.out <<'PYEOF' ||
import fcntl, os, pty, struct, sys, termios
pid, fd = pty.fork()
if pid == 0:
    fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 100, 0, 0))
    os.execvp(sys.argv[1], sys.argv[1:])
out = b""
while True:
    try:
        b = os.read(fd, 65536)
    except OSError:
        break
    if not b:
        break
    out += b
_, st = os.waitpid(pid, 0)
sys.stdout.buffer.write(out.replace(b"\r\n", b"\n"))
sys.exit(os.waitstatus_to_exitcode(st))
PYEOF
    grs_fail "gpurun --wait on a terminal failed: $(cat pty.out)"
for r in 0 1; do
    grep -qxF "[$r] cols 96" pty.out || grs_fail "rank $r under --wait on a 100-column terminal: $(cat pty.out)"
done
# Not on a terminal: none.
# shellcheck disable=SC2016 # expanded by the rank
run plain.out plain.err --wait -- sh -c 'echo "cols ${COLUMNS-unset}"'
expect_rc "gpurun --wait to a file" 0
grep -qxF '[0] cols unset' plain.out || grs_fail "--wait to a file: $(cat plain.out)"
echo "# gpurun --wait on a 100-column terminal: COLUMNS 96 for the ranks; to a file none"
