#!/usr/bin/env bash
# Live targets, measured (as root): a production PostgreSQL of the script's own
# on loopback (TLS, SCRAM), registered as a target; then, in interleaved
# rounds (scripts/bench_live.py), a plain connection to it and its first row
# (the baseline), a grant minted to its first row through the router, an
# executor on a grant from start to exit (a trivial command, and a 10 MB file
# in and out), and the whole per-request pattern (grant, exec, files back,
# revoke). Results go to bench/results/live.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" -eq 0 ] || { echo "run as root (it makes a loop volume and runs servers as other users)" >&2; exit 1; }
export AIRLOCK_ROUTER=127.0.0.1:7492 AIRLOCK_GATEWAY=127.0.0.1:7493 AIRLOCK_REDIS_ROUTER=127.0.0.1:7494
export AIRLOCK_HOME=${AIRLOCK_BENCH_HOME:-/var/lib/airlock-bench-live}
GOLDENS=""
source scripts/bench-lib.sh
rounds=${ROUNDS:-30}
[ -x target/release/airlock ] || cargo build --release --locked -p airlock
prod=$(mktemp -d /var/tmp/airlock-bench-prod.XXXXXX)
port=7495
stop_prod() { runuser -u nobody -- "$pgbin/pg_ctl" -D "$prod/data" -m immediate stop >/dev/null 2>&1 || true; rm -rf "$prod"; }
bench_fresh_root
# (after bench_fresh_root, whose own trap this one replaces)
trap 'bench_cleanup; stop_prod' EXIT
airlock daemon start >/dev/null 2>&1 || airlock ls >/dev/null
chown nobody "$prod"
openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=localhost \
  -keyout "$prod/server.key" -out "$prod/server.crt" >/dev/null 2>&1
chown nobody "$prod/server.key" "$prod/server.crt"; chmod 600 "$prod/server.key"
runuser -u nobody -- "$pgbin/initdb" -D "$prod/data" -U postgres --auth=trust >/dev/null
printf 'local all all trust\nhostssl all all 127.0.0.1/32 scram-sha-256\n' > "$prod/data/pg_hba.conf"
runuser -u nobody -- "$pgbin/pg_ctl" -D "$prod/data" -l "$prod/log" -w start -o \
  "-c listen_addresses=127.0.0.1 -p $port -c unix_socket_directories=$prod -c ssl=on -c ssl_cert_file=$prod/server.crt -c ssl_key_file=$prod/server.key" >/dev/null
psql_prod() { "$pgbin/psql" -h "$prod" -p "$port" -U postgres -v ON_ERROR_STOP=1 -qX "$@"; }
psql_prod -d postgres -c "CREATE DATABASE prod"
psql_prod -d prod <<'SQL'
CREATE SCHEMA analytics;
CREATE TABLE analytics.accounts (id int PRIMARY KEY, tenant_id int NOT NULL, name text);
INSERT INTO analytics.accounts SELECT g, CASE WHEN g % 2 = 0 THEN 42 ELSE 7 END, 'acct ' || g FROM generate_series(1, 10) g;
CREATE ROLE ops LOGIN PASSWORD 'bench-ops-pw' CREATEROLE;
GRANT CREATE ON DATABASE prod TO ops;
GRANT USAGE ON SCHEMA analytics TO ops;
GRANT SELECT ON analytics.accounts TO ops WITH GRANT OPTION;
SQL
dsn="postgresql://ops:bench-ops-pw@127.0.0.1:$port/prod?sslmode=require"
echo "$dsn" | airlock target add prod --from-url - >/dev/null
# Throughput through a grant against a plain connection: pgbench -S, in
# alternating rounds, on pgbench's own tables granted whole.
"$pgbin/pgbench" -h "$prod" -p "$port" -U postgres -i -s 10 -q prod >/dev/null 2>&1
psql_prod -d prod -c "GRANT SELECT ON pgbench_accounts, pgbench_branches, pgbench_tellers TO ops WITH GRANT OPTION"
clients=${CLIENTS:-4}
seconds=${SECONDS_EACH:-10}
grant_dsn=$(airlock grant prod --tables public.pgbench_accounts,public.pgbench_branches --ttl 10m --connections $((clients + 2)) --json | json '["dsn"]')
tps() { PGPASSWORD=$2 "$pgbin/pgbench" -n -S -c "$clients" -j "$clients" -T "$seconds" "$1" 2>/dev/null | awk '/^tps/ {print int($3)}'; }
split() { local rest=${1#postgresql://}; local pw=${rest%%@*}; pw=${pw#*:}; echo "$pw"; }
plain_dsn="postgresql://ops@127.0.0.1:$port/prod?sslmode=require"
routed_pw=$(split "$grant_dsn")
routed_dsn="postgresql://$(echo "${grant_dsn#postgresql://}" | sed 's/:[^@]*@/@/')"
throughput=""
for round in 1 2 3; do
  p=$(tps "$plain_dsn" bench-ops-pw); r=$(tps "$routed_dsn" "$routed_pw")
  throughput="$throughput\n# round $round: pgbench -S -c $clients ${seconds}s: plain $p tps, through a grant $r tps"
done
{
  echo "# $(date -u +%FT%TZ) $(nproc) cores, $(free -g | awk '/Mem/ {print $2}') GiB, PostgreSQL $("$pgbin/postgres" --version | awk '{print $3}'), $rounds interleaved rounds"
  echo "# target over TLS (sslmode=require) on loopback; milliseconds"
  PYTHONPATH=clients/python/src /usr/bin/python3 scripts/bench_live.py "$dsn" "$rounds"
  printf "$throughput\n"
} | tee "$out/live.txt"
