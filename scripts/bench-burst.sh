#!/usr/bin/env bash
# Bursts of forks against a warm pool (as root): BURST clients fork the 40 MB
# golden at once, each then running its first query through the router,
# with the golden's pool at POOL members; ROUNDS bursts, GAP seconds apart.
# For each burst: every fork's time to its first answer, how many the pool
# served (the `ready` events' from_pool), and how long the pool took to be
# full again. With POOL=0 every fork is cold, for comparison.
# Results go to bench/results/burst.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" -eq 0 ] || { echo "run as root (it makes a loop volume and runs servers as other users)" >&2; exit 1; }
export AIRLOCK_ROUTER=127.0.0.1:7542 AIRLOCK_GATEWAY=127.0.0.1:7543 AIRLOCK_REDIS_ROUTER=127.0.0.1:7544
export AIRLOCK_HOME=${AIRLOCK_BENCH_HOME:-/var/lib/airlock-bench-burst}
GOLDENS="bench-40mb"
source scripts/bench-lib.sh
burst=${BURST:-8}
pool=${POOL:-4}
rounds=${ROUNDS:-5}
gap=${GAP:-2}
bench_fresh_root
airlock golden create bench-40mb --schema bench/schema.sql --seed bench/seed-40mb.sql >/dev/null
airlock golden pool bench-40mb --size "$pool" >/dev/null

AIRLOCK_CLI="${AIRLOCK_BIN:-./target/release/airlock}" PSQL="$pgbin/psql" python3 - "$burst" "$pool" "$rounds" "$gap" <<'EOF' | tee "$out/burst.txt"
import json, os, statistics, subprocess, sys, threading, time
from datetime import datetime, timezone

burst, pool, rounds, gap = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
cli, psql = os.environ["AIRLOCK_CLI"], os.environ["PSQL"]

def run(*args):
    return subprocess.run([cli, *args], check=True, capture_output=True, text=True).stdout

def pooled():
    return json.loads(run("golden", "show", "bench-40mb", "--json"))["pooled"]

def wait_full(limit=60.0):
    start = time.perf_counter()
    while pooled() < pool:
        if time.perf_counter() - start > limit:
            sys.exit(f"the pool did not fill to {pool} in {limit:.0f} s")
        time.sleep(0.02)
    return time.perf_counter() - start

def one(results, i):
    t = time.perf_counter()
    forked = json.loads(run("fork", "bench-40mb", "--json", "--ttl", "10m"))
    subprocess.run([psql, "-XqAt", "-c", "SELECT 1", forked["dsn"]], check=True, capture_output=True)
    results[i] = ((time.perf_counter() - t) * 1000, forked["id"])

print(f"# airlock bench burst: {burst} forks at once, pool {pool}, {rounds} bursts {gap:g} s apart; "
      f"{datetime.now(timezone.utc):%Y-%m-%dT%H:%MZ}, {os.cpu_count()} cores, {os.uname().release}")
print("round,forks,from_pool,p50_ms,p99_ms,max_ms,refill_s")
wait_full()
every = []
for r in range(1, rounds + 1):
    results = [None] * burst
    threads = [threading.Thread(target=one, args=(results, i)) for i in range(burst)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if pool:
        wait_full()
    refill = time.perf_counter() - start if pool else 0.0
    ids = {sb for _, sb in results}
    events = json.loads(run("events", "--limit", "1000", "--json"))
    served = sum(1 for e in events if e.get("kind") == "ready" and e.get("sandbox") in ids and e["detail"].get("from_pool"))
    times = sorted(ms for ms, _ in results)
    every += times
    p99 = times[min(len(times) - 1, int(0.99 * len(times)))]
    print(f"{r},{burst},{served},{statistics.median(times):.1f},{p99:.1f},{times[-1]:.1f},{refill:.2f}")
    for sb in ids:
        run("rm", sb)
    time.sleep(gap)
every.sort()
print(f"# all bursts: p50 {statistics.median(every):.1f} ms, p99 {every[min(len(every) - 1, int(0.99 * len(every)))]:.1f} ms")
EOF
