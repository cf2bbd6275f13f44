#!/usr/bin/env bash
# What an owner's CREATE DATABASE costs, now that goldens keep template1 for it:
# 1. a cold fork of a golden that keeps template1 (whose files a fork does not
#    clone) against one that has none (as goldens were before), forked in turn,
#    three rounds;
# 2. the first CREATE DATABASE in a sandbox (which copies template1 into place
#    from the golden) against the second.
# Results go to bench/results/template.txt.
set -euo pipefail
cd "$(dirname "$0")/.."

export AIRLOCK_HOME=${AIRLOCK_BENCH_HOME:-/var/lib/airlock-bench-template}
iterations=${ITERATIONS:-30}
creates=${CREATES:-10}
GOLDENS="kept dropped"
source scripts/bench-lib.sh
bench_fresh_root

airlock golden create kept --schema bench/schema.sql --seed bench/seed-40mb.sql >/dev/null
airlock golden create dropped --schema bench/schema.sql --seed bench/seed-40mb.sql >/dev/null
rm -rf "$AIRLOCK_HOME/volume/goldens/dropped/1/pgdata/base/1/"*
files() { find "$AIRLOCK_HOME/volume/goldens/$1/1/pgdata" -type f | wc -l; }
median() { sort -n | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}'; }
{
  echo "# $(date -u +%Y-%m-%dT%H:%MZ) on $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB, $(uname -r)"
  echo "# files in the golden's data directory: kept $(files kept), dropped $(files dropped)"
  for round in 1 2 3; do
    for golden in dropped kept; do
      airlock bench fork --golden "$golden" --iterations "$iterations" --no-baselines --json |
        python3 -c 'import json, sys; r = json.load(sys.stdin)["results"][0]; print("fork round %s %-8s p50 %6.1f ms  p99 %6.1f ms" % (sys.argv[1], sys.argv[2], r["p50_ms"], r["p99_ms"]))' "$round" "$golden"
    done
  done
  first=(); second=()
  for i in $(seq "$creates"); do
    id=$(airlock fork kept --json | python3 -c 'import json, sys; print(json.load(sys.stdin)["id"])')
    times=$(airlock psql "$id" -- -X -q -c '\timing on' -c 'CREATE DATABASE one' -c 'CREATE DATABASE two' | awk '/^Time:/ {print $2}')
    first+=("$(echo "$times" | sed -n 1p)"); second+=("$(echo "$times" | sed -n 2p)")
    airlock rm "$id" >/dev/null
  done
  echo "CREATE DATABASE, $creates sandboxes: first (copies template1) median $(printf '%s\n' "${first[@]}" | median) ms, second median $(printf '%s\n' "${second[@]}" | median) ms"
} | tee "$out/template.txt"
