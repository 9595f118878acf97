#!/usr/bin/env bash
# The leader's horovod rendezvous is no open door. A job that does not use horovod opens no
# port but the leader's own (its daemon's listening sockets, read from /proc). A job whose
# script mentions horovod gets the port and its rank is served, while a stranger (a client
# bound to 127.0.0.2: not this host's address for the connection, not one of the job's hosts)
# flooding it with PUTs of 64 KiB is closed unanswered: nothing stored, the leader's memory
# flat, a few log lines for thousands of refusals. The job's own rank cannot store more than the
# job's ranks can need (64 KiB for one rank). --horovod and --horovod=off beat the script.
# timeout: 180
set -euo pipefail
# shellcheck source=local_common.sh
. "$(dirname "$0")/local_common.sh"
fail_show=(out err)

py=/usr/bin/python3
[ -x "$py" ] || skip "no python3"
# Connections the stranger makes.
FLOOD=2000

# A job that names nothing of horovod: waits until the test says go.
cat >"$work/wait.sh" <<EOF
#!/bin/sh
while [ ! -e "$work/go" ]; do sleep 0.05; done
EOF
chmod +x "$work/wait.sh"

# A rank of a horovod job (its text names horovod's variables): says its port, stores a key,
# waits until the test says go, then stores 4 KiB values until refused (1024 at most). Given no
# rendezvous, it waits for go and says so.
cat >"$work/rank.py" <<'EOF'
import os, sys, time, urllib.error, urllib.request
port = os.environ.get("HOROVOD_GLOO_RENDEZVOUS_PORT")
addr = os.environ.get("HOROVOD_GLOO_RENDEZVOUS_ADDR")
work = sys.argv[1]
def wait_go():
    while not os.path.exists(work + "/go"):
        time.sleep(0.05)
if not port:
    wait_go()
    print("no rendezvous", flush=True)
    sys.exit(0)
def put(path, body):
    req = urllib.request.Request(f"http://{addr}:{port}{path}", data=body, method="PUT")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
print(f"rank put: {put('/mine/0', b'the job s own value')}", flush=True)
with open(work + "/port.tmp", "w") as f:
    f.write(port)
os.rename(work + "/port.tmp", work + "/port")
wait_go()
stored, status = 0, 200
for i in range(1024):
    status = put(f"/fill/{i}", b"v" * 4096)
    if status != 200:
        break
    stored += 4096
print(f"rank stored {stored} bytes, then {status}", flush=True)
EOF

# A stranger: COUNT connections from 127.0.0.2 to PORT, each a PUT of 64 KiB and a GET of the
# rank's key; says how many got any answer.
cat >"$work/stranger.py" <<'EOF'
import socket, sys
port, count = int(sys.argv[1]), int(sys.argv[2])
body = b"x" * 65536
answered = 0
for i in range(count):
    req = (f"PUT /flood/{i} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n"
           .encode() + body) if i % 2 else b"GET /mine/0 HTTP/1.1\r\nHost: x\r\n\r\n"
    s = socket.socket()
    s.settimeout(5)
    s.bind(("127.0.0.2", 0))
    try:
        s.connect(("127.0.0.1", port))
        s.sendall(req)
        if s.recv(4096):
            answered += 1
    except OSError:
        pass
    s.close()
print(f"stranger: {answered} of {count} answered")
EOF

# The TCP ports process PID listens on, sorted, one a line.
cat >"$work/ports.py" <<'EOF'
import os, sys
pid = sys.argv[1]
inodes = set()
for fd in os.listdir(f"/proc/{pid}/fd"):
    try:
        link = os.readlink(f"/proc/{pid}/fd/{fd}")
    except OSError:
        continue
    if link.startswith("socket:["):
        inodes.add(link[8:-1])
ports = set()
for table in ("tcp", "tcp6"):
    with open(f"/proc/{pid}/net/{table}") as f:
        for line in f.readlines()[1:]:
            x = line.split()
            if x[3] == "0A" and x[9] in inodes:
                ports.add(int(x[1].rsplit(":", 1)[1], 16))
print("\n".join(str(p) for p in sorted(ports)))
EOF

# endpoint JOBDIR KEY: the leader's port or pid from JOBDIR/endpoint.json, once written.
endpoint() {
    local i
    for ((i = 0; i < 200; i++)); do
        if [ -s "$1/endpoint.json" ]; then
            "$py" -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' \
                "$1/endpoint.json" "$2"
            return 0
        fi
        sleep 0.05
    done
    fail "no '$1/endpoint.json' after 10 s"
}

# start DIR ARGS...: gpurun --local ARGS in the background, its output in DIR.out and DIR.err.
start() {
    local dir=$1
    shift
    rm -f "$work/go" "$work/port"
    timeout -k 5 60 "$gpurun" --local --gpus-per-node 1 --job-dir "$dir" "$@" \
        >"$dir.out" 2>"$dir.err" </dev/null &
    gp=$!
    bg_pids+=("$gp")
}

# finish: lets the job end and waits for gpurun; sets rc.
finish() {
    touch "$work/go"
    rc=0
    wait "$gp" || rc=$?
}

# ports_of DIR: the leader's listening ports, on one line, but for one: its memory link's
# (daemon/memlink.c, authenticated with the job key), which every job's daemons open. Exactly
# one port more than the others must be there.
ports_of() {
    local all lp
    all=$("$py" "$work/ports.py" "$(endpoint "$1" pid)")
    lp=$(endpoint "$1" port)
    [ "$(grep -cvx -e "$lp" -e "${hport:-0}" <<<"$all")" = 1 ] ||
        fail "expected one listening port besides the leader's and horovod's (the memory link's), got: ${all//$'\n'/ }"
    grep -vx "$(grep -vx -e "$lp" -e "${hport:-0}" <<<"$all")" <<<"$all" | tr '\n' ' ' | sed 's/ $//'
}

# 1. No horovod: the leader's own port alone (and its memory link's, ports_of).
job=$work/plain
start "$job" -- "$work/wait.sh"
lport=$(endpoint "$job" port)
got=$(ports_of "$job")
finish
[ "$rc" = 0 ] || fail "the plain job exited with status $rc, not 0"
[ "$got" = "$lport" ] || fail "a job without horovod listens on '$got', not its leader's port '$lport' alone"
echo "# a job without horovod: one listening port, the leader's ($lport)"

# 2. A horovod job: the rendezvous port too, served to the rank, closed to the stranger.
job=$work/hvd
start "$job" -- "$py" "$work/rank.py" "$work"
for ((i = 0; i < 200; i++)); do
    [ -s "$work/port" ] || sleep 0.05
done
[ -s "$work/port" ] || { show "$job.err"; fail "the rank never said its rendezvous port"; }
hport=$(cat "$work/port")
lport=$(endpoint "$job" port)
got=$(ports_of "$job")
[ "$got" = "$(printf '%s\n' "$lport" "$hport" | sort -n | tr '\n' ' ' | sed 's/ $//')" ] ||
    fail "a horovod job listens on '$got', not on '$lport' and '$hport'"
pid=$(endpoint "$job" pid)
rss0=$(awk '/^VmRSS/ {print $2}' "/proc/$pid/status")
t0=$(date +%s%N)
said=$("$py" "$work/stranger.py" "$hport" "$FLOOD")
flood_ms=$((($(date +%s%N) - t0) / 1000000))
rss1=$(awk '/^VmRSS/ {print $2}' "/proc/$pid/status")
finish
echo "# $said in $flood_ms ms; leader RSS ${rss0} -> ${rss1} KiB"
[ "$rc" = 0 ] || fail "the horovod job exited with status $rc, not 0"
[ "$said" = "stranger: 0 of $FLOOD answered" ] || fail "the stranger was answered: '$said'"
[ $((rss1 - rss0)) -lt 8192 ] || fail "the leader grew by $((rss1 - rss0)) KiB under the stranger's flood"
grep -qxF "[0] rank put: 200" "$job.out" || fail "the rank's own PUT was not served"
line=$(grep -F '[0] rank stored' "$job.out" || true)
[[ $line =~ ^\[0\]\ rank\ stored\ ([0-9]+)\ bytes,\ then\ 507$ ]] ||
    fail "the rank's fill did not end in 507 (store full): '$line'"
[ "${BASH_REMATCH[1]}" -le $((64 * 1024)) ] ||
    fail "the store took ${BASH_REMATCH[1]} bytes from one rank, over 64 KiB"
echo "# the job's rank: ${BASH_REMATCH[1]} bytes stored, then 507"
n=$(grep -c 'horovod rendezvous' "$job.err" || true)
grep -F 'horovod rendezvous' "$job.err" | sed 's/^/# /'
grep -qF "refused a connection from '127.0.0.2:" "$job.err" || fail "no line names the stranger"
grep -qE "refused [0-9]+ connections from '127.0.0.2' in [0-9.]+ s: not one of the job's hosts" "$job.err" ||
    fail "no summary of the stranger's refusals"
[ "$n" -le 6 ] || fail "$n log lines about the horovod rendezvous for $FLOOD refusals, more than 6"

# 3. --horovod=off beats the script, --horovod the plain command.
job=$work/off
start "$job" --horovod=off -- "$py" "$work/rank.py" "$work"
lport=$(endpoint "$job" port)
got=$(ports_of "$job")
finish
[ "$rc" = 0 ] || fail "the --horovod=off job exited with status $rc, not 0"
[ "$got" = "$lport" ] || fail "--horovod=off: listening on '$got', not '$lport' alone"
grep -qxF "[0] no rendezvous" "$job.out" || fail "--horovod=off: the rank was given a rendezvous"
job=$work/on
start "$job" --horovod -- "$work/wait.sh"
lport=$(endpoint "$job" port)
got=$("$py" "$work/ports.py" "$(endpoint "$job" pid)" | tr '\n' ' ' | sed 's/ $//')
finish
[ "$rc" = 0 ] || fail "the --horovod job exited with status $rc, not 0"
# The leader's, horovod's and the memory link's.
[ "$(echo "$got" | wc -w)" = 3 ] || fail "--horovod: listening on '$got', not three ports"
echo "# --horovod=off: no port; --horovod: the port"
