#!/usr/bin/env bash
# Sustained cold forks (as root): `airlock bench churn` (fork, first query
# through the router, delete, again) from 1, 2 and 4 clients at once on the
# 40 MB golden, with the host's CPU time over each run, so each cycle's CPU
# cost is read beside its rate (with what the kernel does after the run for
# the run's deletions). No pool: every fork is cold.
# CLIENTS (default "1 2 4") and SECONDS_EACH (default 20) set the run.
# Results go to bench/results/churn.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" -eq 0 ] || { echo "run as root (it makes a loop volume and runs servers as other users)" >&2; exit 1; }
export AIRLOCK_ROUTER=127.0.0.1:7532 AIRLOCK_GATEWAY=127.0.0.1:7533 AIRLOCK_REDIS_ROUTER=127.0.0.1:7534
export AIRLOCK_HOME=${AIRLOCK_BENCH_HOME:-/var/lib/airlock-bench-churn}
GOLDENS="bench-40mb"
source scripts/bench-lib.sh
clients=${CLIENTS:-1 2 4}
seconds=${SECONDS_EACH:-20}
bench_fresh_root
airlock golden create bench-40mb --schema bench/schema.sql --seed bench/seed-40mb.sql >/dev/null

# Busy CPU time of the whole host so far, in milliseconds (user, nice,
# system, irq, softirq, steal from /proc/stat's first line).
busy_ms() {
  awk -v hz="$(getconf CLK_TCK)" '/^cpu / {print ($2 + $3 + $4 + $7 + $8 + $9) * 1000 / hz; exit}' /proc/stat
}

# Waits until the kernel has finished dropping deleted Btrfs subvolumes: its
# cleaner thread does that after the deletion returns, so a run that stopped
# counting at its last cycle would leave that CPU out.
settled() {
  while [ -n "$(btrfs subvolume list -d "$AIRLOCK_HOME/volume" 2>/dev/null)" ]; do sleep 0.2; done
}

{
  echo "# airlock bench churn, ${seconds} s per client count, bench-40mb, cold forks; $(date -u +%FT%TZ), $(nproc) cores, $(uname -r)"
  echo "clients,cycles_per_second,cycle_p50_ms,cycle_p99_ms,cpu_ms_per_cycle"
  for c in $clients; do
    sleep 2
    before=$(busy_ms)
    out=$(airlock bench churn --golden bench-40mb --duration "${seconds}s" --clients "$c" --json)
    settled
    after=$(busy_ms)
    CHURN_JSON=$out python3 - "$c" "$before" "$after" <<'PY'
import json, os, sys
c, before, after = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
r = json.loads(os.environ["CHURN_JSON"])
s = r["results"][0]
cycles = s["runs"]
print(f"{c},{r['per_second']:.1f},{s['p50_ms']:.1f},{s['p99_ms']:.1f},{(after - before) / cycles:.0f}")
PY
  done
} | tee bench/results/churn.txt
