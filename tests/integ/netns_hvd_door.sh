#!/bin/bash
# Horovod's rendezvous across nodes serves the job's hosts and no one else: a two-node job
# (job.json's "horovod": 1) in network namespaces, whose ranks store and read each other's keys
# through the leader's rendezvous port (node 1's rank is served from its own address, one of the
# job's hosts), while a third namespace, not a host of the job, floods that port with PUTs and
# GETs: every connection is closed unanswered, and node 0's log says so in a few lines.
# timeout: 120
# lane: side
set -euo pipefail
# shellcheck source=tests/netns.sh disable=SC1091
. "$(dirname "$0")/../netns.sh"

NODES=2
# Connections the stranger makes.
FLOOD=500
netns_test_begin 3 rendezvousd
job=$NETNS_WORK/job-door-$$
work=$NETNS_WORK

# A rank: stores its key, waits for every rank's, says the port (rank 0), waits for go.
cat >"$work/rank.py" <<'EOF'
import os, sys, time, urllib.error, urllib.request
work = sys.argv[1]
rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
base = "http://%s:%s" % (os.environ["HOROVOD_GLOO_RENDEZVOUS_ADDR"],
                         os.environ["HOROVOD_GLOO_RENDEZVOUS_PORT"])
def call(method, path, body=None):
    req = urllib.request.Request(base + path, data=body, method=method)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, b""
status, _ = call("PUT", f"/door/{rank}", f"rank {rank}".encode())
if status != 200:
    print(f"rank {rank}: PUT got {status}", flush=True)
    sys.exit(1)
deadline = time.monotonic() + 30
for r in range(size):
    while call("GET", f"/door/{r}")[0] != 200:
        if time.monotonic() > deadline:
            print(f"rank {rank}: no key of rank {r}", flush=True)
            sys.exit(1)
        time.sleep(0.05)
if rank == 0:
    with open(work + "/port.tmp", "w") as f:
        f.write(os.environ["HOROVOD_GLOO_RENDEZVOUS_PORT"])
    os.rename(work + "/port.tmp", work + "/port")
while not os.path.exists(work + "/go"):
    time.sleep(0.05)
print(f"rank {rank}: served", flush=True)
EOF

# The stranger: COUNT connections to ADDR:PORT, each a PUT or a GET; how many got an answer.
cat >"$work/stranger.py" <<'EOF'
import socket, sys
addr, port, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
answered = 0
for i in range(count):
    req = (b"PUT /door/9 HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\nmine" if i % 2
           else b"GET /door/0 HTTP/1.1\r\nHost: x\r\n\r\n")
    s = socket.socket()
    s.settimeout(5)
    try:
        s.connect((addr, port))
        s.sendall(req)
        if s.recv(4096):
            answered += 1
    except OSError:
        pass
    s.close()
print(f"stranger: {answered} of {count} answered")
EOF

addr0=$(netns_addr 0)
netns_job_write "$job" "$NODES" 1 '"join_timeout_ms": 20000, "kill_grace_ms": 1000, "horovod": 1' \
    python3 "$work/rank.py" "$work"
NETNS_DAEMONS=()
for ((k = 0; k < NODES; k++)); do
    addr=$(netns_addr "$k")
    netns_spawn -e "$work/node$k.err" "$k" "$work/node$k.out" "$NETNS_BUILD/rendezvousd" \
        --job-dir "$job" --node-rank "$k" --bind "$addr" --advertise "$addr" --hostname "node$k"
    NETNS_DAEMONS[k]=$NETNS_PID
done
for ((i = 0; i < 600; i++)); do
    [ -s "$work/port" ] && break
    sleep 0.05
done
[ -s "$work/port" ] || fail "the ranks never exchanged their keys through the rendezvous"
port=$(cat "$work/port")
said=$(netns_exec 2 python3 "$work/stranger.py" "$addr0" "$port" "$FLOOD")
touch "$work/go"
for ((k = 0; k < NODES; k++)); do
    netns_wait "${NETNS_DAEMONS[k]}" 30000 || fail "node $k's rendezvousd still runs after 30 s"
    [ "$NETNS_STATUS" = 0 ] || fail "node $k's rendezvousd exited with status $NETNS_STATUS, not 0"
    grep -qxF "[$k] rank $k: served" "$work/node$k.out" || fail "node $k's rank was not served"
done
echo "# $said (from $(netns_addr 2), not a host of the job)"
[ "$said" = "stranger: 0 of $FLOOD answered" ] || fail "the stranger was answered: '$said'"
grep -F 'horovod rendezvous' "$work/node0.err" | sed 's/^/# /'
grep -qF "refused a connection from '$(netns_addr 2):" "$work/node0.err" ||
    fail "no line names the stranger"
n=$(grep -c 'horovod rendezvous' "$work/node0.err" || true)
[ "$n" -le 4 ] || fail "$n log lines about the horovod rendezvous for $FLOOD refusals, more than 4"
echo "# node 1's rank served from $(netns_addr 1); the stranger refused in $n log lines"
