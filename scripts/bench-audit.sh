#!/usr/bin/env bash
# Audit log benchmark: what the hash-chained log adds to each recorded event
# (store only vs with the log vs with the log and --audit-fsync, interleaved in
# one run), and pooled forks end to end on a daemon without and with
# --audit-fsync, in the same run. Results go to bench/results/.
set -euo pipefail
cd "$(dirname "$0")/.."

export AIRLOCK_HOME=${AIRLOCK_BENCH_HOME:-/var/lib/airlock-bench-audit}
iterations=${ITERATIONS:-100}
rounds=${ROUNDS:-5000}
GOLDENS="bench-40mb"
source scripts/bench-lib.sh
bench_fresh_root

{
  echo "# $(date -u +%Y-%m-%dT%H:%MZ) on $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB, $(uname -r)"
  echo "## per event recorded ($rounds rounds of a pooled fork's three events and a tool call's)"
  airlock bench audit --rounds "$rounds"
} | tee "$out/audit.txt"
airlock bench audit --rounds "$rounds" --json > "$out/audit.json"

# Pooled forks end to end: the daemon as shipped, then with --audit-fsync.
airlock golden create bench-40mb --schema bench/schema.sql --seed bench/seed-40mb.sql --pool 4 >/dev/null
for mode in default fsync; do
  if [ "$mode" = fsync ]; then
    airlock daemon stop --with-router >/dev/null
    AIRLOCK_AUDIT_FSYNC=true nohup ./target/release/airlock serve >> "$AIRLOCK_HOME/daemon.log" 2>&1 &
    for _ in $(seq 100); do airlock daemon status >/dev/null 2>&1 && break; sleep 0.1; done
  fi
  echo "## pooled forks, audit log $mode" | tee -a "$out/audit.txt"
  airlock bench fork --golden bench-40mb --iterations "$iterations" --no-baselines | tee -a "$out/audit.txt"
done
