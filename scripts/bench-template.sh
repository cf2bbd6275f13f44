#!/usr/bin/env bash
# What keeping template1 in goldens (so an owner's CREATE DATABASE has a template
# to copy) costs a cold fork: two goldens built alike, one of which has its
# template1 files removed after the build (nothing in a fork reads them unless
# the agent creates a database), forked in turn, three rounds each.
# Results go to bench/results/template.txt.
set -euo pipefail
cd "$(dirname "$0")/.."

export AIRLOCK_HOME=${AIRLOCK_BENCH_HOME:-/var/lib/airlock-bench-template}
iterations=${ITERATIONS:-30}
GOLDENS="kept dropped"
source scripts/bench-lib.sh
bench_fresh_root

airlock golden create kept --schema bench/schema.sql --seed bench/seed-40mb.sql >/dev/null
airlock golden create dropped --schema bench/schema.sql --seed bench/seed-40mb.sql >/dev/null
rm -rf "$AIRLOCK_HOME/volume/goldens/dropped/1/pgdata/base/1/"*
files() { find "$AIRLOCK_HOME/volume/goldens/$1/1/pgdata" -type f | wc -l; }
{
  echo "# $(date -u +%Y-%m-%dT%H:%MZ) on $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB, $(uname -r)"
  echo "# files in the golden's data directory: kept $(files kept), dropped $(files dropped)"
  for round in 1 2 3; do
    for golden in dropped kept; do
      airlock bench fork --golden "$golden" --iterations "$iterations" --no-baselines --json |
        python3 -c 'import json, sys; r = json.load(sys.stdin)["results"][0]; print("round %s %-8s p50 %6.1f ms  p99 %6.1f ms" % (sys.argv[1], sys.argv[2], r["p50_ms"], r["p99_ms"]))' "$round" "$golden"
    done
  done
} | tee "$out/template.txt"
