#!/usr/bin/env bash
# Masked and subsetted imports (as root). The source: `pgbench -i
# --foreign-keys` at scale SCALE (100: about 1.5 GB) and a `customers` table
# of CUSTOMERS rows holding personal data (a unique email, a name, a unique
# phone, an address inside jsonb, free text quoting phone numbers). In one
# run, alternating: a plain import and a masked one (twice each), a 2% subset
# (of the branches, with their accounts, tellers and history, and of the
# customers), and the scan. Results go to bench/results/masking.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" -eq 0 ] || { echo "run as root (it makes a loop volume and runs servers as other users)" >&2; exit 1; }
scale=${SCALE:-100}
customers=${CUSTOMERS:-1000000}
export AIRLOCK_ROUTER=127.0.0.1:7470 AIRLOCK_GATEWAY=127.0.0.1:7471 AIRLOCK_REDIS_ROUTER=127.0.0.1:7472
export AIRLOCK_HOME=${AIRLOCK_BENCH_HOME:-/var/lib/airlock-bench-masking}
GOLDENS="plain-1 plain-2 masked-1 masked-2 slice"
source scripts/bench-lib.sh
src=/var/lib/airlock-bench-masking-src
cleanup() {
  bench_source_stop
  bench_cleanup
}
trap cleanup EXIT
cleanup
airlock storage init --size 40G >/dev/null
bench_source_start
psql_src() { "$pgbin/psql" -XqAt -h "$src" -U postgres "$@" source; }
"$pgbin/pgbench" -q -i --foreign-keys -s "$scale" -h "$src" -U postgres source >/dev/null 2>&1
psql_src -c "
CREATE TABLE customers (id bigint PRIMARY KEY, email text NOT NULL UNIQUE, full_name text NOT NULL,
  phone text UNIQUE, profile jsonb, notes text);
INSERT INTO customers
  SELECT g, 'user' || g || '@mail' || (g % 97) || '.example-corp.com',
         (ARRAY['Maria','James','Linda','Ahmed','Sofia','Wei'])[1 + g % 6] || ' Surname' || g,
         '+44 20 ' || lpad(g::text, 8, '0'),
         jsonb_build_object('address', jsonb_build_object('street', g || ' Harbour Street', 'city', 'Leeds'), 'vip', g % 50 = 0),
         CASE WHEN g % 10 = 0 THEN 'call me back on +44 20 ' || lpad(g::text, 8, '0') ELSE 'all fine' END
  FROM generate_series(1, $customers) g;
ANALYZE;" >/dev/null
bytes=$(psql_src -c "SELECT pg_database_size('source')")
dsn="postgresql://postgres@/source?host=$src"
rules="$src/rules.toml"
cat > "$rules" <<'TOML'
[[columns]]
column = "public.customers.email"
transform = "email"
[[columns]]
column = "public.customers.full_name"
transform = "name"
[[columns]]
column = "public.customers.phone"
transform = "phone"
[[columns]]
column = "public.customers.notes"
transform = "redact"
[[columns]]
column = "public.customers.profile"
transform = "json"
paths = [{ path = "address.street", transform = "address" }]
TOML
build() { # NAME ARGS...: one import; prints its line
  local name=$1; shift
  local t0 t1
  t0=$(date +%s%N)
  echo "$dsn" | airlock golden create "$name" --from-url - --jobs 2 "$@" --json > "$src/$name.json"
  t1=$(date +%s%N)
  python3 - "$src/$name.json" "$(((t1 - t0) / 1000000))" "$bytes" <<'PY'
import json, sys
g = json.load(open(sys.argv[1])); ms = int(sys.argv[2]); size = int(sys.argv[3])
m = g["generations"][0]; r = m["import"]
line = (f"{g['name']}: total {ms/1000:.1f} s, {size/1048576/(ms/1000):.1f} MB/s of source "
        f"(dump {r['dump_seconds']:.1f} s, restore {r['restore_seconds']:.1f} s), golden {m['size_bytes']/1048576:.0f} MiB")
if r.get("masking"):
    k = r["masking"]; e = k["elsewhere"]
    line += (f"; masking and leak check {k['seconds']:.1f} s, {len(k['columns'])} columns, "
             f"{sum(c['distinct_values'] for c in k['columns'])} distinct values, "
             f"{e['values']} source values searched in {e['columns_searched']} columns, leak check "
             f"{'passed' if k['passed'] else 'FAILED'}")
if r.get("subset"):
    s = r["subset"]
    line += f"; subset cut {s['seconds']:.1f} s, {s['references_checked']} references checked"
    for t in s["tables"]:
        line += f"\n    {t['table']}: {t['kept_rows']} of {t['source_rows']} rows ({t['why']})"
print(line)
PY
}
{
  echo "# Masked and subsetted imports: pgbench scale $scale and $customers customers, $((bytes / 1048576)) MiB on disk"
  echo "# $(date -u +%FT%TZ), $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(uname -r), PostgreSQL $("$pgbin/postgres" --version | awk '{print $3}')"
  echo "### plain and masked imports, alternating (--jobs 2)"
  for run in 1 2; do
    build "plain-$run"
    build "masked-$run" --mask "$rules"
    [ "$run" -eq 2 ] || airlock golden rm "plain-$run" --force >/dev/null
    [ "$run" -eq 2 ] || airlock golden rm "masked-$run" --force >/dev/null
  done
  echo "### a 2% subset, masked (branches with their accounts, tellers and history; customers)"
  build slice --mask "$rules" --subset public.pgbench_branches --subset public.customers --subset-percent 2
  echo "### the scan (200 rows sampled per table)"
  t0=$(date +%s%N)
  echo "$dsn" | airlock golden scan --from-url - --json > "$src/scan.json"
  t1=$(date +%s%N)
  python3 -c "
import json; r = json.load(open('$src/scan.json'))
print(f\"scan: {($t1 - $t0) / 1e9:.2f} s from the CLI ({r['seconds']:.2f} s in the daemon), {r['tables']} tables, found: {', '.join(c['column'] + ' (' + c['class'] + ')' for c in r['columns'])}\")"
} | tee "$out/masking.txt"
