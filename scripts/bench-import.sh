#!/usr/bin/env bash
# Importing a live database (as root): a source PostgreSQL filled by
# `pgbench -i` at scale SCALE (100: about 1.5 GB), imported with
# `golden create --from-url` serially (--jobs 1) and in parallel (--jobs 4),
# each twice; then fork time (p50 of 10 cold forks) of the imported golden.
# Results go to bench/results/import.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" -eq 0 ] || { echo "run as root (it makes a loop volume and runs servers as other users)" >&2; exit 1; }
scale=${SCALE:-100}
export AIRLOCK_ROUTER=127.0.0.1:7460 AIRLOCK_GATEWAY=127.0.0.1:7461
export AIRLOCK_HOME=${AIRLOCK_BENCH_HOME:-/var/lib/airlock-bench-import}
GOLDENS="imp-serial-1 imp-serial-2 imp-parallel-1 imp-parallel-2"
source scripts/bench-lib.sh
src=/var/lib/airlock-bench-import-src
cleanup() {
  bench_source_stop
  bench_cleanup
}
trap cleanup EXIT
cleanup
airlock storage init --size 40G >/dev/null
bench_source_start
"$pgbin/pgbench" -q -i -s "$scale" -h "$src" -U postgres source >/dev/null 2>&1
bytes=$("$pgbin/psql" -XqAt -h "$src" -U postgres -c "SELECT pg_database_size('source')" source)
dsn="postgresql://postgres@/source?host=$src"
{
  echo "# Import of a live database: pgbench scale $scale, $((bytes / 1048576)) MiB on disk"
  echo "# $(date -u +%FT%TZ), $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(uname -r)"
  for jobs in 1 4; do
    kind=serial; [ "$jobs" -gt 1 ] && kind=parallel
    for run in 1 2; do
      t0=$(date +%s%N)
      echo "$dsn" | airlock golden create "imp-$kind-$run" --from-url - --jobs "$jobs" --json > "$src/report.json"
      t1=$(date +%s%N)
      ms=$(((t1 - t0) / 1000000))
      python3 - "$src/report.json" "$ms" "$bytes" "$jobs" <<'PY'
import json, sys
g = json.load(open(sys.argv[1])); ms = int(sys.argv[2]); size = int(sys.argv[3])
r = g["generations"][0]["import"]
print(f"jobs {sys.argv[4]}: total {ms/1000:.1f} s, {size/1048576/(ms/1000):.1f} MB/s of source "
      f"(dump {r['dump_seconds']:.1f} s, restore {r['restore_seconds']:.1f} s, archive {r['bytes']/1048576:.0f} MiB, "
      f"{r['rows']} rows, fidelity {'DIFFERS' if r.get('row_differences') or r.get('catalog_differences') else 'exact'})")
PY
      [ "$run" -eq 2 ] || airlock golden rm "imp-$kind-$run" --force >/dev/null
    done
  done
  echo "### fork time of the imported golden (PostgreSQL $("$pgbin/postgres" --version | awk '{print $3}'))"
  airlock bench fork --golden imp-parallel-2 --iterations 10 --no-baselines
} | tee "$out/import.txt"
