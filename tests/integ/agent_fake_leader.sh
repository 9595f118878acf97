#!/usr/bin/env bash
# A real agent against a leader written here in Python from the wire format alone (lib/auth.h,
# lib/proto.h): the agent opens its link with the one-frame hello, its join in the same
# write; the hello's tag and every frame's HMAC check with keys derived here, independently
# of lib/auth.c. Its rank's put (the gpurun Python module) returns at once, forwarded as
# quiet (the leader waits for the rank to say so); the leader refuses it, and the agent, whose
# rank was told it was kept, aborts the job naming the refusal. Node 1 of a 2-node job, its
# leader on loopback.
# timeout: 60
set -euo pipefail

# shellcheck source=prologue.sh
. "$(dirname "$0")/prologue.sh"
fail_show=('*.err' '*.out' 'leader.log')
need_built rendezvousd
python=${GPURUN_PYTHON:-/usr/bin/python3}
[ -x "$python" ] || skip "no '$python'"
export PYTHONDONTWRITEBYTECODE=1

dir=$work/job
mkdir -m 0700 "$dir"
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$dir/key"
chmod 600 "$dir/key"
cat >"$dir/job.json" <<JSON
{"version": 1, "job_id": "fake-leader", "nnodes": 2, "nprocs": 1, "loopback": true,
 "kill_grace_ms": 500, "join_timeout_ms": 20000,
 "argv": ["$python", "-c", "import gpurun, time; gpurun.set('k', 'v'); open('$work/returned', 'w').close(); time.sleep(30)"]}
JSON

cat >"$work/leader.py" <<'PY'
import hashlib, hmac, json, os, socket, struct, sys, time

key = bytes.fromhex(open(sys.argv[1]).read().strip())
out = open(sys.argv[2], "w")
srv = socket.create_server(("127.0.0.1", 0))
print(srv.getsockname()[1], flush=True)
srv.settimeout(30)
conn, _ = srv.accept()
conn.settimeout(30)
buf = b""

def log(*a):
    print(*a, file=out, flush=True)

def frame():
    global buf
    while True:
        if len(buf) >= 4:
            n = struct.unpack(">I", buf[:4])[0]
            if len(buf) >= 4 + n:
                f, buf = buf[4:4 + n], buf[4 + n:]
                return f
        chunk = conn.recv(65536)
        if not chunk:
            raise SystemExit("the agent closed the link")
        buf += chunk

def mac(k, m):
    return hmac.new(k, m, hashlib.sha256).digest()

hello = frame()
assert len(hello) == 68 and hello[:4] == b"GRJ1", hello[:4]
nonce, zero = hello[4:36], bytes(32)
assert hmac.compare_digest(hello[36:], mac(key, b"gpurun early" + nonce + zero)), "hello tag"
c2s = mac(key, b"gpurun ec2s" + nonce + zero)
s2c = mac(key, b"gpurun es2c" + nonce + zero)
rx = tx = 0

def recv():
    global rx
    p = frame()
    seq, body, tag = p[:8], p[8:-32], p[-32:]
    assert hmac.compare_digest(tag, mac(c2s, seq + body)), "frame tag"
    assert struct.unpack(">Q", seq)[0] == rx, "frame seq"
    rx += 1
    return json.loads(body)

def send(m):
    global tx
    body = json.dumps(m, separators=(",", ":")).encode()
    seq = struct.pack(">Q", tx)
    tx += 1
    p = seq + body + mac(s2c, seq + body)
    conn.sendall(struct.pack(">I", len(p)) + p)

m = recv()
while m["type"] != "join":
    m = recv()
log("join", m["node_rank"], m["nprocs"])
send({"type": "assign", "generation": 0, "world_size": 2, "rank_base": 1, "nnodes": 2,
      "master_addr": "127.0.0.1", "master_port": 1, "hvd_port": 0, "hvd_host": "",
      "spare": False, "mem_addr": "", "mem_port": 0, "mem_node": -1})
while True:
    m = recv()
    if m["type"] == "kv_put":
        # Unanswered here, the put must return in the rank all the same (its marker file).
        deadline = time.monotonic() + 10
        while not os.path.exists(sys.argv[3]) and time.monotonic() < deadline:
            time.sleep(0.01)
        log("kv_put", m["key"], "quiet" if m.get("quiet") else "answered",
            "returned" if os.path.exists(sys.argv[3]) else "waiting")
        send({"type": "error", "id": m["id"], "code": "bad_request", "msg": "refused here"})
    elif m["type"] == "abort":
        log("abort", m.get("status"), m["cause"])
        break
    elif m["type"] == "hb":
        send({"type": "hb"})
conn.close()
PY

"$python" "$work/leader.py" "$dir/key" "$work/leader.log" "$work/returned" >"$work/leader.out" \
    2>"$work/leader.err" &
leader=$!
bg_pids=("$leader")
for _ in $(seq 100); do
    [ -s "$work/leader.out" ] && break
    sleep 0.05
done
port=$(head -n 1 "$work/leader.out")
[ -n "$port" ] || fail "the fake leader did not listen: $(cat "$work/leader.err")"

rc=0
timeout -k 5 40 "$build/rendezvousd" --job-dir "$dir" --node-rank 1 \
    --rendezvous "127.0.0.1:$port" --log-level info >"$work/n1.out" 2>"$work/n1.err" || rc=$?
wait "$leader" || fail "the fake leader failed: $(tail -n 5 "$work/leader.err")"
bg_pids=()

grep -qxF "join 1 1" "$work/leader.log" || fail "no join from node 1 in the leader's log"
grep -qxF "kv_put k quiet returned" "$work/leader.log" ||
    fail "the rank's put did not come as quiet, or did not return unanswered: $(grep kv_put "$work/leader.log" || true)"
grep -q "^abort 125 the leader refused a put or a barrier of node 1: bad_request: refused here" \
    "$work/leader.log" || fail "no abort naming the refusal: $(grep abort "$work/leader.log" || true)"
[ "$rc" != 0 ] || fail "the agent exited 0 after aborting its job"
echo "# agent exit status $rc after the refused put"
