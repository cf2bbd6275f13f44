#!/usr/bin/env bash
# What checking a file part by part costs: the same ten updates of a
# 20,000-row table, written as one transaction (the baseline, measured in the
# same run; 8,000 rows in all) and as ten of the file's own BEGIN/COMMIT blocks, each tested with
# `migrate test` and promoted with `migrate promote` to a real target, five
# times; psql applying the one-transaction file unchecked is the baseline for
# promote. Results go to bench/results/promote.txt.
set -euo pipefail
cd "$(dirname "$0")/.."

export AIRLOCK_HOME=${AIRLOCK_BENCH_HOME:-/var/lib/airlock-bench-promote}
export AIRLOCK_ROUTER=127.0.0.1:7450 AIRLOCK_GATEWAY=127.0.0.1:7451
GOLDENS=app
source scripts/bench-lib.sh
runs=${RUNS:-5}
target=$(mktemp -d /tmp/airlock-bench-target.XXXXXX)
chown postgres "$target"
as_postgres() { su postgres -s /bin/bash -c "$1"; }
stop_target() {
  as_postgres "$pgbin/pg_ctl -D $target/data -m immediate stop" >/dev/null 2>&1 || true
  rm -rf "$target"
  bench_cleanup
}
bench_fresh_root
trap stop_target EXIT

# The target: a server of its own, its database owned by a role of its own.
as_postgres "$pgbin/initdb -D $target/data -A trust -E UTF8 --locale=C >/dev/null"
as_postgres "$pgbin/pg_ctl -D $target/data -l $target/log -w -o '-p 55490 -k $target -c listen_addresses=' start >/dev/null"
super="postgresql://postgres@/postgres?host=$target&port=55490"
owner="postgresql://app_owner@/app?host=$target&port=55490"
"$pgbin/psql" -X -q "$super" -c "CREATE ROLE app_owner LOGIN" -c "CREATE DATABASE app OWNER app_owner"
"$pgbin/psql" -X -q "$owner" <<'SQL'
CREATE TABLE users (id bigserial PRIMARY KEY, email text NOT NULL, score int NOT NULL DEFAULT 0);
INSERT INTO users (email) SELECT 'u' || g || '@x.test' FROM generate_series(1, 20000) g;
SQL
echo "postgresql://postgres@/app?host=$target&port=55490" | airlock golden create app --from-url - >/dev/null

work=$(mktemp -d)
: > "$work/whole.sql"; : > "$work/parts.sql"
for i in $(seq 0 9); do
  echo "UPDATE users SET score = score + 1 WHERE id % 25 = $i;" >> "$work/whole.sql"
  printf 'BEGIN;\nUPDATE users SET score = score + 1 WHERE id %% 25 = %d;\nCOMMIT;\n' "$i" >> "$work/parts.sql"
done
now_ms() { date +%s%3N; }
: > "$work/times"
for run in $(seq 1 "$runs"); do
  for shape in whole parts; do
    start=$(now_ms)
    airlock migrate test --golden app "$work/$shape.sql" --report "$work/$shape.report" --json > "$work/$shape.test.json" || { cat "$work/$shape.test.json"; exit 1; }
    tested=$(( $(now_ms) - start ))
    start=$(now_ms)
    echo "$owner" | airlock migrate promote --report "$work/$shape.report" --target - "$work/$shape.sql" --json > /dev/null
    promoted=$(( $(now_ms) - start ))
    echo "$shape $tested $promoted" >> "$work/times"
    # The same rows again, so the next run's target has not drifted.
    "$pgbin/psql" -X -q "$owner" -c "UPDATE users SET score = 0"
  done
  # Baseline for promote: psql applying the same file in one transaction, unchecked.
  start=$(now_ms)
  "$pgbin/psql" -X -q -1 -v ON_ERROR_STOP=1 "$owner" -f "$work/whole.sql"
  echo "psql 0 $(( $(now_ms) - start ))" >> "$work/times"
  "$pgbin/psql" -X -q "$owner" -c "UPDATE users SET score = 0"
done
{
echo "# $(date -u +%Y-%m-%dT%H:%MZ) on $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB, $(uname -r), $runs runs"
python3 - "$work/times" <<'PY'
import statistics, sys
rows = [line.split() for line in open(sys.argv[1])]
def of(shape, col):
    return sorted(int(r[col]) for r in rows if r[0] == shape)
print(f"{'':44}{'median':>10}{'max':>10}")
for label, col in (("migrate test", 1), ("migrate promote", 2)):
    for shape in ("whole", "parts"):
        t = of(shape, col)
        print(f"{label + ', ' + shape:44}{statistics.median(t):>8.0f}ms{max(t):>8}ms")
    extra = (statistics.median(of("parts", col)) - statistics.median(of("whole", col))) / 9
    print(f"{label + ': each part beyond the first':44}{extra:>8.0f}ms")
t = of("psql", 2)
print(f"{'psql -1 -f, whole, unchecked (baseline)':44}{statistics.median(t):>8.0f}ms{max(t):>8}ms")
print(f"{'promote, whole / psql':44}{statistics.median(of('whole', 2)) / statistics.median(t):>9.1f}x")
PY
} | tee "$out/promote.txt"
rm -rf "$work"
