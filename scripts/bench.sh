#!/usr/bin/env bash
# Fork benchmark: time from fork request to first query answered, for a ~40 MB and
# a ~1.5 GB golden, with the baselines (CREATE DATABASE ... TEMPLATE, pg_restore,
# initdb + seed) measured in the same run. Results go to bench/results/.
set -euo pipefail
cd "$(dirname "$0")/.."

export AIRLOCK_HOME=${AIRLOCK_BENCH_HOME:-/var/lib/airlock-bench}
iterations=${ITERATIONS:-30}
large_baselines=${LARGE_BASELINE_ITERATIONS:-5}
GOLDENS="bench-40mb bench-1500mb"
source scripts/bench-lib.sh
bench_fresh_root
airlock doctor

echo "building goldens (the large one takes a few minutes)"
airlock golden create bench-40mb --schema bench/schema.sql --seed bench/seed-40mb.sql >/dev/null
airlock golden create bench-1500mb --schema bench/schema.sql --seed bench/seed-1500mb.sql >/dev/null
airlock golden ls

{
  echo "# $(date -u +%Y-%m-%dT%H:%MZ) on $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB, $(uname -r)"
  airlock bench fork --golden bench-40mb --iterations "$iterations"
  echo
  airlock bench fork --golden bench-1500mb --iterations "$iterations" --baseline-iterations "$large_baselines"
} | tee "$out/fork.txt"
airlock bench fork --golden bench-40mb --iterations "$iterations" --no-baselines --json > "$out/fork-40mb.json"
airlock bench fork --golden bench-1500mb --iterations "$iterations" --no-baselines --json > "$out/fork-1500mb.json"

# Forks claimed from a warm pool of 4 (each fork waits, off the clock, for the pool to refill).
for g in bench-40mb bench-1500mb; do
  airlock golden pool "$g" --size 4 >/dev/null
  airlock bench fork --golden "$g" --iterations "$iterations" --no-baselines | tee -a "$out/fork.txt"
  airlock bench fork --golden "$g" --iterations "$iterations" --no-baselines --json > "$out/pool-${g#bench-}.json"
  airlock golden pool "$g" --size 0 >/dev/null
done

# What the audit log adds to the events a pooled fork and a tool call record,
# with and without --audit-fsync (scripts/bench-audit.sh has more).
airlock bench audit --rounds "${AUDIT_ROUNDS:-5000}" | tee -a "$out/fork.txt"
