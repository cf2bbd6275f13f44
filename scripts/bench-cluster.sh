#!/usr/bin/env bash
# Cross-node against local, in one run, on this host: three nodes (each a daemon
# in a network namespace of its own on a bridge), one etcd. From node a's CLI,
# interleaved: a fork placed on a (local) and one placed on b (forwarded over
# the node-to-node TLS link), each to its first answer (a query through the
# API of node a), then deleted; and `show` of a sandbox on a and of one on b.
# Then, from b's host, connections to a sandbox on a: through b's router
# (relayed to a's over the node-to-node link) against a DSN naming a's router
# directly: psql's connect-and-query time (TLS verify-full), and pgbench
# read-only transactions per second at 2 and 8 clients. Then forks a second
# through three nodes against one, and last the replication of a ~1.5 GB
# golden from a to b against copying and hashing its files.
# Usage: scripts/bench-cluster.sh [PAIRS]   (as root; uses target/release/airlock)
set -euo pipefail
pairs=${1:-30}
bin=$(realpath target/release/airlock)
[ "$(id -u)" -eq 0 ] || { echo "needs root (network namespaces)" >&2; exit 1; }
command -v etcd >/dev/null || { echo "needs etcd (apt-get install etcd-server)" >&2; exit 1; }
n=$((200 + RANDOM % 50)); br=albench$n; work=$(mktemp -d /var/lib/airlock-bench-cluster.XXXX); chmod 0755 "$work"
cleanup() {
  for h in "$work"/a "$work"/b "$work"/c; do AIRLOCK_HOME=$h "$bin" daemon stop --with-router >/dev/null 2>&1 || true; done
  sleep 1; pkill -f "$work" >/dev/null 2>&1 || true; kill "${etcd_pid:-0}" 2>/dev/null || true
  for node in a b c; do ip netns del al$n$node 2>/dev/null || true; done; ip link del "$br" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
ip link add "$br" type bridge; ip addr add 10.231.$n.1/24 dev "$br"; ip link set "$br" up
i=11
for node in a b c; do
  ip netns add al$n$node
  ip link add alv$n$node type veth peer name eth0 netns al$n$node
  ip link set alv$n$node master "$br" up
  ip -n al$n$node addr add 10.231.$n.$i/24 dev eth0; ip -n al$n$node link set eth0 up; ip -n al$n$node link set lo up
  i=$((i + 1))
done
etcd --name b --data-dir "$work/etcd" --listen-client-urls http://10.231.$n.1:2379 --advertise-client-urls http://10.231.$n.1:2379 \
  --listen-peer-urls http://127.0.0.1:2$n --initial-advertise-peer-urls http://127.0.0.1:2$n --initial-cluster b=http://127.0.0.1:2$n >/dev/null 2>&1 &
etcd_pid=$!
until curl -sf http://10.231.$n.1:2379/health >/dev/null; do sleep 0.1; done
mkdir -p "$work/a" "$work/b" "$work/c"
AIRLOCK_HOME=$work/a "$bin" cluster init >/dev/null
AIRLOCK_HOME=$work/a "$bin" cluster token --node b --advertise 10.231.$n.12:7440 --out "$work/b.token" >/dev/null
AIRLOCK_HOME=$work/a "$bin" cluster token --node c --advertise 10.231.$n.13:7440 --out "$work/c.token" >/dev/null
start() { # node ip-suffix extra...
  local node=$1 ip=$2; shift 2
  AIRLOCK_HOME=$work/$node AIRLOCK_ROUTER=0.0.0.0:7432 AIRLOCK_REDIS_ROUTER=off AIRLOCK_GATEWAY=off \
    setsid ip netns exec al$n$node "$bin" serve --cluster http://10.231.$n.1:2379 --node "$node" \
    --advertise 10.231.$n.$ip:7440 --router-host 10.231.$n.$ip "$@" >"$work/$node.log" 2>&1 &
  until [ -S "$work/$node/airlock.sock" ]; do sleep 0.1; done
}
start a 11
start b 12 --join "$work/b.token"
start c 13 --join "$work/c.token"
printf 'CREATE TABLE orders (id int PRIMARY KEY, total numeric);\n' >"$work/schema.sql"
printf 'INSERT INTO orders SELECT g, g FROM generate_series(1, 1000) g;\n' >"$work/seed.sql"
for node in a b c; do AIRLOCK_HOME=$work/$node "$bin" golden create shop --schema "$work/schema.sql" --seed "$work/seed.sql" >/dev/null; done
sleep 3 # b's golden announced
AIRLOCK_HOME=$work/a BIN=$bin PAIRS=$pairs NS_B=al${n}b WORK=$work python3 - <<'PY'
import json, os, subprocess, time, statistics
bin, pairs, home = os.environ["BIN"], int(os.environ["PAIRS"]), os.environ["AIRLOCK_HOME"]
sock = home + "/airlock.sock"
def cli(*args):
    out = subprocess.run([bin, *args, "--json"], capture_output=True, text=True)
    if out.returncode: raise SystemExit(f"airlock {args}: {out.stdout}{out.stderr}")
    return json.loads(out.stdout) if out.stdout.strip() else None
def sql(sid):
    out = subprocess.run(["curl", "-sf", "--unix-socket", sock, "-X", "POST", "-H", "content-type: application/json",
                          "-d", '{"sql":"SELECT count(*) FROM orders"}', f"http://x/v1/sandboxes/{sid}/sql"], capture_output=True, text=True)
    if out.returncode or "1000" not in out.stdout: raise SystemExit(f"sql: {out.stdout}")
def fork_to_answer(node):
    t = time.perf_counter(); sb = cli("fork", "shop", "--node", node); sql(sb["id"]); took = time.perf_counter() - t
    assert sb["node"] == node, sb
    cli("rm", sb["id"]); return took
keep = {n: cli("fork", "shop", "--node", n, "--ttl", "1h")["id"] for n in "ab"}
def show(node):
    t = time.perf_counter(); cli("show", keep[node]); return time.perf_counter() - t
res = {k: [] for k in ["fork_local", "fork_cross", "show_local", "show_cross"]}
for i in range(pairs + 2):
    for kind, node in [("local", "a"), ("cross", "b")] if i % 2 == 0 else [("cross", "b"), ("local", "a")]:
        f, s = fork_to_answer(node), show(node)
        if i >= 2:  # two warm-up pairs
            res["fork_" + kind].append(f); res["show_" + kind].append(s)
def p(xs, q): xs = sorted(xs); return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]
print(f"pairs: {pairs} (after 2 warm-up pairs), interleaved; times in ms")
for k, xs in res.items():
    print(f"{k:11} median {statistics.median(xs)*1000:7.1f}  p99 {p(xs, .99)*1000:7.1f}")
ratio = [c / l for c, l in zip(res["fork_cross"], res["fork_local"])]
print(f"cross/local fork to first answer, pair by pair: median {statistics.median(ratio):.2f}x")
hop = [c - l for c, l in zip(res["show_cross"], res["show_local"])]
print(f"the forwarding hop (show cross - show local): median {statistics.median(hop)*1000:.1f} ms")

# Routed connections, from b's host, to the sandbox on a.
ns_b, work = os.environ["NS_B"], os.environ["WORK"]
the_dsn = subprocess.run([bin, "dsn", keep["a"]], capture_output=True, text=True, check=True).stdout.strip()
userinfo, rest = the_dsn.split("@", 1)
database = rest.split("/", 1)[1].split("?", 1)[0]
password = userinfo.rsplit(":", 1)[1]
direct_host = rest.split("/", 1)[0]
b_host = json.loads(subprocess.run([bin, "nodes", "--json"], capture_output=True, text=True).stdout)[1]["router"]
dsns = {
    "direct": f"postgresql://airlock_agent@{direct_host}/{database}?sslmode=verify-full&sslrootcert={work}/a/tls/ca.crt",
    "routed": f"postgresql://airlock_agent@{b_host}/{database}?sslmode=verify-full&sslrootcert={work}/b/tls/ca.crt",
}
env = dict(os.environ, PGPASSWORD=password)
def connect(kind):
    t = time.perf_counter()
    out = subprocess.run(["ip", "netns", "exec", ns_b, "psql", dsns[kind], "-XtAc", "SELECT 1"], capture_output=True, text=True, env=env)
    if out.returncode or out.stdout.strip() != "1": raise SystemExit(f"psql {kind}: {out.stderr}")
    return time.perf_counter() - t
conn = {"direct": [], "routed": []}
for i in range(pairs + 2):
    for kind in ["direct", "routed"] if i % 2 == 0 else ["routed", "direct"]:
        took = connect(kind)
        if i >= 2: conn[kind].append(took)
print("connect + SELECT 1 with psql from b's host (TLS verify-full):")
for k, xs in conn.items():
    print(f"  {k:6} median {statistics.median(xs)*1000:7.1f}  p99 {p(xs, .99)*1000:7.1f}")
ratio = [r / d for r, d in zip(conn["routed"], conn["direct"])]
print(f"  routed/direct, pair by pair: median {statistics.median(ratio):.2f}x")
script = f"{work}/point.sql"
open(script, "w").write("\\set id random(1, 1000)\nSELECT total FROM orders WHERE id = :id;\n")
def tps(kind, clients):
    out = subprocess.run(["ip", "netns", "exec", ns_b, "pgbench", "-n", "-c", str(clients), "-j", "2", "-T", "8", "-f", script,
                          dsns[kind].replace("verify-full", "require")], capture_output=True, text=True, env=env)
    for line in out.stdout.splitlines():
        if line.startswith("tps ="): return float(line.split()[2])
    raise SystemExit(f"pgbench {kind}: {out.stdout}{out.stderr}")
print("pgbench point reads (TLS) from b's host, transactions per second:")
for clients in [2, 8]:
    d, r = tps("direct", clients), tps("routed", clients)
    d2 = tps("direct", clients)
    d = (d + d2) / 2
    print(f"  {clients} clients: direct {d:8.0f}  routed {r:8.0f}  routed/direct {r / d:.2f}")
PY

# Forks a second across three nodes: three workers, one through each node's
# CLI, each forking (placed by the cluster), running a query through the API
# and deleting, for 20 s; against the same three workers all on node a
# (`--node a`), alternating, twice each. The host's two cores carry every node,
# so CPU use is sampled from /proc/stat to show what bounds it.
AIRLOCK_HOME=$work/a BIN=$bin WORK=$work python3 - <<'PY'
import json, os, subprocess, threading, time, statistics
bin, work = os.environ["BIN"], os.environ["WORK"]
def cli(home, *args):
    out = subprocess.run([bin, *args, "--json"], capture_output=True, text=True, env=dict(os.environ, AIRLOCK_HOME=f"{work}/{home}"))
    return json.loads(out.stdout) if out.returncode == 0 and out.stdout.strip() else None
def busy():
    f = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    return sum(f) - f[3] - f[4], sum(f)
def phase(homes, extra, seconds=20):
    done, stop = [], time.time() + seconds
    placed = {}
    def worker(home):
        while time.time() < stop:
            sb = cli(home, "fork", "shop", "--ttl", "5m", *extra)
            if sb is None: continue
            placed[sb["node"]] = placed.get(sb["node"], 0) + 1
            subprocess.run(["curl", "-sf", "--unix-socket", f"{work}/{home}/airlock.sock", "-X", "POST", "-H", "content-type: application/json",
                            "-d", '{"sql":"SELECT 1"}', f"http://x/v1/sandboxes/{sb['id']}/sql"], capture_output=True)
            cli(home, "rm", sb["id"]); done.append(1)
    (b0, t0), start = busy(), time.perf_counter()
    threads = [threading.Thread(target=worker, args=(h,)) for h in homes]
    for t in threads: t.start()
    for t in threads: t.join()
    (b1, t1), took = busy(), time.perf_counter() - start
    return len(done) / took, (b1 - b0) / (t1 - t0), placed
rates = {"three nodes": [], "node a alone": []}
for _ in range(2):
    for kind, homes, extra in [("three nodes", ["a", "b", "c"], []), ("node a alone", ["a", "a", "a"], ["--node", "a"])]:
        rate, cpu, placed = phase(homes, extra)
        rates[kind].append(rate)
        print(f"  {kind:12} {rate:5.1f} forks/s (fork, query, delete)  CPU busy {cpu * 100:3.0f}%  placed {placed}")
print("forks a second, 3 workers, 20 s each, 2 rounds (median):")
for k, xs in rates.items(): print(f"  {k:12} {statistics.median(xs):5.1f}")
print(f"  three nodes / node a alone: {statistics.median(rates['three nodes']) / statistics.median(rates['node a alone']):.2f}")
PY

# Replication of the ~1.5 GB golden (bench/seed-1500mb.sql) from a to b,
# three rounds, each beside the two floors it stands on, measured in the same
# round: a plain copy of the generation's files on the same disk (cp -a), and
# hashing them (sha256sum). The golden is removed from b between rounds.
echo "building the ~1.5 GB golden on a..."
AIRLOCK_HOME=$work/a "$bin" golden create big --schema "$PWD/bench/schema.sql" --seed "$PWD/bench/seed-1500mb.sql" >/dev/null
AIRLOCK_HOME=$work/a BIN=$bin WORK=$work python3 - <<'PY'
import json, os, subprocess, time, statistics
bin, work = os.environ["BIN"], os.environ["WORK"]
gen = f"{work}/a/volume/goldens/big/1"
def run(*args, home="a"):
    out = subprocess.run(list(args), capture_output=True, text=True, env=dict(os.environ, AIRLOCK_HOME=f"{work}/{home}"))
    if out.returncode: raise SystemExit(f"{args}: {out.stdout}{out.stderr}")
    return out.stdout
def timed(*args, home="a"):
    t = time.perf_counter(); out = run(*args, home=home); return time.perf_counter() - t, out
size = int(run("du", "-sb", "--exclude=files.json", gen).split()[0])
res = {"cp -a (same disk)": [], "sha256sum": [], "golden replicate": []}
for _ in range(3):
    took, _ = timed("cp", "-a", gen, f"{work}/copy"); res["cp -a (same disk)"].append(took); run("rm", "-rf", f"{work}/copy")
    took, _ = timed("sh", "-c", f"find {gen} -type f ! -name files.json -print0 | xargs -0 sha256sum > /dev/null"); res["sha256sum"].append(took)
    took, out = timed(bin, "golden", "replicate", "big", "--nodes", "b", "--json")
    fetched = json.loads(out)[0]
    assert fetched["from"] == "a" and fetched["attempts"] == 1, fetched
    res["golden replicate"].append(took)
    run(bin, "golden", "rm", "big", home="b")
print(f"replicating the {size / 1e9:.2f} GB golden from a to b (3 rounds; MB = 10^6 bytes):")
for k, xs in res.items():
    m = statistics.median(xs)
    print(f"  {k:18} median {m:6.2f} s  {size / 1e6 / m:6.0f} MB/s")
print(f"  replicate / cp -a: {statistics.median(res['golden replicate']) / statistics.median(res['cp -a (same disk)']):.2f}x the time")
PY
