#!/bin/bash
# No open door on the Slurm test cluster: a 2-node job that does not use horovod listens on its
# leader's port alone (the leader's sockets, read from /proc); a 2-node job whose script names
# horovod's variables gets the rendezvous port too, its ranks on both nodes store and read each
# other's keys through it, and the cluster's third node, not a host of the job, is closed
# unanswered on every one of its connections, in a few log lines.
# timeout: 180
# lane: side
set -euo pipefail
# shellcheck source=slurm_client_common.sh
. "$(dirname "$0")/slurm_client_common.sh"

# Connections the stranger makes.
FLOOD=500
work=$GRS_WORK

# The ranks of the horovod job: store a key, wait for every rank's, say the port, wait for go.
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
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
if call("PUT", f"/door/{rank}", f"rank {rank}".encode()) != 200:
    sys.exit(1)
for r in range(size):
    while call("GET", f"/door/{r}") != 200:
        time.sleep(0.05)
if rank == 0:
    with open(work + "/port.tmp", "w") as f:
        f.write(os.environ["HOROVOD_GLOO_RENDEZVOUS_PORT"])
    os.rename(work + "/port.tmp", work + "/port")
while not os.path.exists(work + "/go"):
    time.sleep(0.05)
print(f"rank {rank}: served", flush=True)
EOF

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

# endpoint ID KEY: KEY of job ID's endpoint.json, once written.
endpoint() {
    local i f=$GPURUN_JOBS/$1/endpoint.json
    for ((i = 0; i < 300; i++)); do
        [ -s "$f" ] && break
        sleep 0.1
    done
    [ -s "$f" ] || grs_fail "no '$f' after 30 s"
    json "$f" "v['$2']"
}

# 1. No horovod: the leader's port alone (and its memory link's).
rm -f "$work/go"
# shellcheck disable=SC2016 # expanded by each rank
run sub.out sub.err -N 2 --gpus-per-node 1 --kill-grace 1 -- sh -c \
    'while [ ! -e "$0/go" ]; do sleep 0.1; done' "$work"
expect_rc "gpurun (plain job)" 0
id=$(job_id sub.out)
wait_running "$id" 2
lport=$(endpoint "$id" port)
all=$("$py" "$work/ports.py" "$(endpoint "$id" pid)")
# But for one: the daemon's memory link (daemon/memlink.c, authenticated with the job key).
[ "$(grep -cvx -e "$lport" <<<"$all")" = 1 ] ||
    grs_fail "expected one listening port besides the leader's (the memory link's), got: ${all//$'\n'/ }"
got=$(grep -x -e "$lport" <<<"$all" || true)
touch "$work/go"
state=$(grs_job_wait "$id" 60) || grs_fail "job $id did not end within 60 s"
[ "$state" = COMPLETED ] || grs_fail "the plain job ended $state"
[ "$got" = "$lport" ] || grs_fail "a job without horovod listens on '$got', not its leader's port '$lport' alone"
echo "# a 2-node job without horovod: one listening port, the leader's ($lport)"

# 2. Horovod: served to the job's nodes, closed to the third.
rm -f "$work/go" "$work/port"
run sub.out sub.err -N 2 --gpus-per-node 1 --kill-grace 1 -- "$py" "$work/rank.py" "$work"
expect_rc "gpurun (horovod job)" 0
id=$(job_id sub.out)
for ((i = 0; i < 300; i++)); do
    [ -s "$work/port" ] && break
    sleep 0.1
done
[ -s "$work/port" ] || grs_fail "the ranks never exchanged their keys through the rendezvous"
port=$(cat "$work/port")
addr=$(endpoint "$id" host)
mapfile -t nodes < <(scontrol show hostnames "$(job_field "$id" NodeList)")
stranger=
for ((k = 1; k <= GRS_NODES; k++)); do
    [[ " ${nodes[*]} " == *" $(grs_node_name "$k") "* ]] || stranger=$k
done
[ -n "$stranger" ] || grs_fail "every node is the job's: ${nodes[*]}"
said=$(grs_exec "$stranger" "$py" "$work/stranger.py" "$addr" "$port" "$FLOOD")
touch "$work/go"
state=$(grs_job_wait "$id" 60) || grs_fail "job $id did not end within 60 s"
[ "$state" = COMPLETED ] || grs_fail "the horovod job ended $state"
echo "# $said (from $(grs_node_name "$stranger"), not a node of the job ${nodes[*]})"
[ "$said" = "stranger: 0 of $FLOOD answered" ] || grs_fail "the stranger was answered: '$said'"
lines=$(grep -rhF 'horovod rendezvous' "$GPURUN_JOBS" || true)
printf '%s\n' "$lines" | sed 's/^/# /'
grep -qF "refused a connection from '$(grs_node_addr "$stranger"):" <<<"$lines" ||
    grs_fail "no line names the stranger"
n=$(grep -c . <<<"$lines" || true)
[ "$n" -le 4 ] || grs_fail "$n log lines about the horovod rendezvous for $FLOOD refusals"
