#!/usr/bin/env bash
# Migration airlock overhead: `migrate test` of the 10 candidates in
# bench/migrations/ in parallel on the ~1.5 GB golden, against the time the
# migrations themselves take when applied with psql to a plain fork (measured in
# the same run). Results go to bench/results/migrate.txt.
set -euo pipefail
cd "$(dirname "$0")/.."

export AIRLOCK_HOME=${AIRLOCK_BENCH_HOME:-/var/lib/airlock-bench-migrate}
export AIRLOCK_ROUTER=127.0.0.1:7440 AIRLOCK_GATEWAY=127.0.0.1:7441
GOLDENS=bench-1500mb
source scripts/bench-lib.sh
bench_fresh_root
echo "building the ~1.5 GB golden (a few minutes)"
airlock golden create bench-1500mb --schema bench/schema.sql --seed bench/seed-1500mb.sql >/dev/null
candidates=(bench/migrations/*.sql)
now_ms() { date +%s%3N; }

{
echo "# $(date -u +%Y-%m-%dT%H:%MZ) on $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB, $(uname -r)"
echo
echo "## Baseline: each migration applied with psql -f to a plain fork, one at a time"
total=0; longest=0
for f in "${candidates[@]}"; do
  sb=$(airlock fork bench-1500mb --json --idle-suspend 0 --statement-timeout 30m)
  dsn=$(echo "$sb" | json "['socket_dsn']")
  id=$(echo "$sb" | json "['id']")
  start=$(now_ms)
  "$pgbin/psql" "$dsn" -X -q -v ON_ERROR_STOP=1 -f "$f" >/dev/null
  took=$(( $(now_ms) - start ))
  airlock rm "$id" >/dev/null
  printf '%-28s %8d ms\n' "$(basename "$f")" "$took"
  total=$((total + took)); [ "$took" -gt "$longest" ] && longest=$took
done
printf '%-28s %8d ms\n%-28s %8d ms\n' "sum" "$total" "longest" "$longest"
echo
for parallel in 10 1; do
  echo "## migrate test, ${#candidates[@]} candidates, --parallel $parallel"
  start=$(now_ms)
  airlock migrate test --golden bench-1500mb "${candidates[@]}" --parallel "$parallel" \
    --statement-timeout 30m --json > "$out/migrate-report-$parallel.json" || true
  wall=$(( $(now_ms) - start ))
  python3 - "$out/migrate-report-$parallel.json" "$wall" "$total" "$longest" <<'PY'
import json, sys
report, wall, total, longest = json.load(open(sys.argv[1])), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
for c in report["candidates"]:
    kinds = ",".join(sorted({h["kind"] for h in c["hazards"]})) or "-"
    print(f"{c['name']:28} {c['duration_ms']:8.0f} ms  {'pass' if c['passed'] else 'FAIL'}  {kinds}")
print(f"{'wall time (CLI to report)':28} {wall:8d} ms")
print(f"{'overhead over the sum':28} {wall - total:8d} ms  ({wall / max(total, 1):.2f}x the migrations' own time)")
PY
  echo
done
} | tee "$out/migrate.txt"
