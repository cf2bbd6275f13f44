#!/usr/bin/env bash
# Migration airlock overhead: `migrate test` of the 10 candidates in
# bench/migrations/ in parallel on the ~1.5 GB golden, against the time the
# migrations themselves take when applied with psql to a plain fork (measured in
# the same run); the one-off measurement of the golden's per-row costs; whether
# the verdicts of a parallel run and a one-at-a-time run are identical; and what
# --app-queries and --workload add. Results go to bench/results/migrate.txt.
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
echo "## The golden's per-row costs, measured once per generation by the first test"
start=$(now_ms)
airlock migrate test --golden bench-1500mb bench/migrations/01_nullable_column.sql --json > /dev/null || true
first=$(( $(now_ms) - start ))
start=$(now_ms)
airlock migrate test --golden bench-1500mb bench/migrations/01_nullable_column.sql --json > /dev/null || true
second=$(( $(now_ms) - start ))
printf '%-28s %8d ms\n%-28s %8d ms\n%-28s %8d ms\n' "first test (measures costs)" "$first" \
  "second test" "$second" "the measurement" "$((first - second))"
costs=$(find "$AIRLOCK_HOME/migration-costs" -name 'bench-1500mb-1-*.json' | head -n1)
python3 -c "import json, sys; print('costs (µs per row):', json.dumps(json.load(open(sys.argv[1]))['costs']))" "$costs" || true
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
echo "## The same verdicts from --parallel 10 (CPU-bound) and --parallel 1"
python3 - "$out/migrate-report-10.json" "$out/migrate-report-1.json" <<'PY'
import json, sys
def verdicts(path):
    return {c["name"]: (c["hazards"], c.get("notes", [])) for c in json.load(open(path))["candidates"]}
a, b = verdicts(sys.argv[1]), verdicts(sys.argv[2])
same = [n for n in a if a[n] == b.get(n)]
print(f"identical hazards (kinds, severities, lines, messages, estimates): {len(same)} of {len(a)} candidates")
for n in sorted(set(a) - set(same)):
    print(f"  differs: {n}")
PY
echo
echo "## With the application's queries planned and a workload beside each candidate, --parallel 1"
start=$(now_ms)
airlock migrate test --golden bench-1500mb "${candidates[@]}" --parallel 1 --statement-timeout 30m \
  --app-queries bench/app-queries.sql --workload default --workload-clients 2 --json \
  > "$out/migrate-report-app.json" || true
wall=$(( $(now_ms) - start ))
python3 - "$out/migrate-report-app.json" "$wall" "$total" <<'PY'
import json, sys
report, wall, total = json.load(open(sys.argv[1])), int(sys.argv[2]), int(sys.argv[3])
for c in report["candidates"]:
    kinds = ",".join(sorted({h["kind"] for h in c["hazards"]})) or "-"
    waits = "; ".join(s for s in (c.get("workload") or {}).get("summary", []) if "waited up" in s) or "no waits"
    print(f"{c['name']:28} {c['duration_ms']:8.0f} ms  {kinds}  | {waits}")
print(f"{'wall time (CLI to report)':28} {wall:8d} ms  ({wall / max(total, 1):.2f}x the migrations' own time)")
PY
} | tee "$out/migrate.txt"
