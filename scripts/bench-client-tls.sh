#!/usr/bin/env bash
# What TLS costs a client per connection (as root): one sandbox of a golden
# with PostgreSQL and Redis, then scripts/bench_client_tls.py with the
# installed redis-py and, in a venv of its own, an older one (REDIS_PY_OLD,
# default 5.0.8) that built a fresh SSL context for every connection.
# Results go to bench/results/client-tls.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" -eq 0 ] || { echo "run as root (it makes a loop volume and runs servers as other users)" >&2; exit 1; }
export AIRLOCK_ROUTER=127.0.0.1:7502 AIRLOCK_GATEWAY=127.0.0.1:7503 AIRLOCK_REDIS_ROUTER=127.0.0.1:7504
export AIRLOCK_HOME=${AIRLOCK_BENCH_HOME:-/var/lib/airlock-bench-client-tls}
GOLDENS="kv"
source scripts/bench-lib.sh
venv=$(scripts/python-env.sh)
old=target/python-redis-old
old_version=${REDIS_PY_OLD:-5.0.8}
if ! "$old/bin/python" -c "import redis, psycopg; assert redis.__version__ == '$old_version'" 2>/dev/null; then
  python3 -m venv "$old"
  "$old/bin/pip" install --quiet --disable-pip-version-check "redis==$old_version" "psycopg[binary]" >&2
fi
work=$(mktemp -d /var/tmp/airlock-bench-client-tls.XXXXXX)
# bench_fresh_root sets its own exit trap: this one, which includes it, comes after.
bench_fresh_root
trap 'bench_cleanup || true; rm -rf "$work"' EXIT
printf 'CREATE TABLE t (id int);\n' > "$work/schema.sql"
printf 'SET greeting hi\n' > "$work/seed.redis"
airlock golden create kv --schema "$work/schema.sql" --redis-seed "$work/seed.redis" >/dev/null
sb=$(airlock fork kv --ttl 1h --json)
DSN=$(echo "$sb" | json '["dsn"]') REDIS_URL=$(echo "$sb" | json '["redis_url"]') CA=$AIRLOCK_HOME/tls/ca.crt
export DSN REDIS_URL CA
{
  echo "# Client-side TLS per connection, $(date -u +%FT%TZ), $(nproc) cores, $(uname -r), $(python3 --version)"
  "$venv/bin/python" scripts/bench_client_tls.py
  "$old/bin/python" scripts/bench_client_tls.py
} | tee bench/results/client-tls.txt
