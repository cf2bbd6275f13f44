#!/usr/bin/env bash
# Fork time per PostgreSQL major (as root): the same 40 MB golden built on 13,
# 14, the host's own 15, 16, 17 and 18 (`airlock postgres install` first), then
# `bench fork` on each: fork request to first query answered through the router,
# median and p99 of cold forks. The host's major is the baseline of the same run.
# Results go to bench/results/majors.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" -eq 0 ] || { echo "run as root (it makes a loop volume and runs servers as other users)" >&2; exit 1; }
export AIRLOCK_ROUTER=127.0.0.1:7462 AIRLOCK_GATEWAY=127.0.0.1:7463
export AIRLOCK_HOME=${AIRLOCK_BENCH_HOME:-/var/lib/airlock-bench-majors}
majors="13 14 15 16 17 18"
GOLDENS=$(for m in $majors; do printf 'pg%s ' "$m"; done)
source scripts/bench-lib.sh
iterations=${ITERATIONS:-20}
airlock postgres install 13 14 16 17 18 >/dev/null
bench_fresh_root
{
  echo "# Fork time per PostgreSQL major: bench/schema.sql + bench/seed-40mb.sql, $iterations cold forks each"
  echo "# $(date -u +%FT%TZ), $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(uname -r)"
  for m in $majors; do
    airlock golden create "pg$m" --postgres "$m" --schema "$PWD/bench/schema.sql" --seed "$PWD/bench/seed-40mb.sql" >/dev/null
    echo "### PostgreSQL $m ($(airlock golden show "pg$m" --json | json '["generations"][0]["postgres_version"]'))"
    airlock bench fork --golden "pg$m" --iterations "$iterations" --no-baselines
  done
} | tee "$out/majors.txt"
