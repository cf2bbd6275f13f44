#!/usr/bin/env bash
# The router authenticating agents itself, all in one run (as root):
#  1. fork request to first query answered through the router, cold and from a
#     pool of 4; with BASE=/path/to/an/older/airlock also that binary first (its
#     router relayed the server's own SCRAM, 16 iterations, and started a backend
#     for every client);
#  2. connect time (pgbench -C): router plaintext and TLS (SCRAM with 4096
#     iterations, -PLUS on TLS), the private socket, and a plain PostgreSQL with
#     its default SCRAM (4096 iterations), plaintext and TLS;
#  3. a 50 MB result (COPY ... TO STDOUT through psql) from the router with TLS and
#     plaintext and from a plain PostgreSQL with TLS, each with and without a CPU
#     hog (one busy loop per core);
#  4. pgbench -S (scale 10, 2 clients): the socket, the router plaintext and TLS,
#     PgBouncer in session mode in front of the same socket.
# Results go to bench/results/router-auth.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" -eq 0 ] || { echo "run as root (it makes a loop volume and runs servers as other users)" >&2; exit 1; }
command -v pgbouncer >/dev/null 2>&1 || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends pgbouncer >/dev/null

iterations=${ITERATIONS:-30}
runs=${RUNS:-7}
export AIRLOCK_ROUTER=127.0.0.1:7450 AIRLOCK_GATEWAY=127.0.0.1:7451
export AIRLOCK_HOME=${AIRLOCK_BENCH_HOME:-/var/lib/airlock-bench-auth}
GOLDENS=bench-40mb
source scripts/bench-lib.sh
ref=/var/lib/airlock-bench-auth-ref
hogs=()
cleanup() {
  for p in "${hogs[@]}"; do kill "$p" 2>/dev/null || true; done
  [ -f "$ref/bouncer/pgbouncer.pid" ] && kill "$(cat "$ref/bouncer/pgbouncer.pid")" 2>/dev/null || true
  [ -d "$ref/data" ] && runuser -u airlock -- "$pgbin/pg_ctl" -D "$ref/data" -m immediate stop >/dev/null 2>&1 || true
  rm -rf "$ref"
  bench_cleanup
}
trap cleanup EXIT
hog_on() { for _ in $(seq "$(nproc)"); do (while :; do :; done) & hogs+=($!); done; }
hog_off() { for p in "${hogs[@]}"; do kill "$p" 2>/dev/null || true; done; hogs=(); }
median() { sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
# Milliseconds for psql to receive a 50 MB COPY from $1 (password in $2).
copy_ms() {
  local t0 t1
  t0=$(date +%s%N)
  PGPASSWORD=$2 "$pgbin/psql" "$1" -XqAtc "COPY (SELECT repeat('x', 999) FROM generate_series(1, 50000)) TO STDOUT" >/dev/null
  t1=$(date +%s%N)
  echo $(((t1 - t0) / 1000000))
}
# A DSN without its password (given by PGPASSWORD instead, so it is in no command line).
strip_pw() { python3 -c "import re,sys; print(re.sub(r'^(postgresql://[^:@/]+):[^@]*@', r'\1@', sys.argv[1]))" "$1"; }
pw_of() { python3 -c "import sys,urllib.parse as u; print(u.unquote(u.urlsplit(sys.argv[1]).password or ''))" "$1"; }

forks() {
  airlock storage init --size 20G >/dev/null
  airlock golden create bench-40mb --schema bench/schema.sql --seed bench/seed-40mb.sql >/dev/null
  echo "### cold"
  airlock bench fork --golden bench-40mb --iterations "$iterations" --no-baselines
  airlock golden pool bench-40mb --size 4 >/dev/null
  echo "### from a pool of 4"
  airlock bench fork --golden bench-40mb --iterations "$iterations" --no-baselines
  airlock golden pool bench-40mb --size 0 >/dev/null
}

{
echo "# $(date -u +%Y-%m-%dT%H:%MZ) on $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB, $(uname -r), $("$pgbin/postgres" --version)"
echo
echo "## 1. Fork request to first query answered, through the router (plaintext)"
if [ -n "${BASE:-}" ]; then
  airlock() { "$BASE" "$@"; }
  bench_cleanup
  echo "## base: $BASE"
  forks
  bench_cleanup
  airlock() { ./target/release/airlock "$@"; }
fi
bench_cleanup
echo "## now"
if [ -z "${SKIP_FORKS:-}" ]; then
  forks
else
  airlock storage init --size 20G >/dev/null
  airlock golden create bench-40mb --schema bench/schema.sql --seed bench/seed-40mb.sql >/dev/null
fi

sb=$(airlock fork bench-40mb --json --ttl 2h --idle-suspend 0)
id=$(echo "$sb" | json "['id']")
tls=$(echo "$sb" | json "['dsn']")
socket=$(echo "$sb" | json "['socket_dsn']")
password=$(pw_of "$tls")
tls_nopw=$(strip_pw "$tls")
plain_nopw="${tls_nopw%%\?*}?sslmode=disable"
socket_nopw=$(strip_pw "$socket")
"$pgbin/pgbench" -i -s 10 -q "$socket" >/dev/null 2>&1
export PGPASSWORD=$password

# The reference: a plain PostgreSQL on loopback (TLS offered, SCRAM with its
# default 4096 iterations), same server settings.
mkdir -p "$ref" && chown airlock "$ref"
echo "$password" > "$ref/pw" && chown airlock "$ref/pw" && chmod 600 "$ref/pw"
runuser -u airlock -- "$pgbin/initdb" -D "$ref/data" -U bench --auth=scram-sha-256 --pwfile="$ref/pw" >/dev/null
cp "$AIRLOCK_HOME/tls/server.crt" "$AIRLOCK_HOME/tls/server.key" "$ref/data/"
chown airlock "$ref/data/server.crt" "$ref/data/server.key" && chmod 600 "$ref/data/server.key"
runuser -u airlock -- "$pgbin/pg_ctl" -D "$ref/data" -l "$ref/log" -w start \
  -o "-c port=7452 -c listen_addresses=127.0.0.1 -c unix_socket_directories=$ref -c ssl=on -c fsync=off" >/dev/null
reference="postgresql://bench@127.0.0.1:7452/postgres?sslmode=require"
reference_plain="postgresql://bench@127.0.0.1:7452/postgres?sslmode=disable"

echo
echo "## 2. Connect time (pgbench -C, SELECT 1, 1 client, 10 s), ms per connection"
echo "SELECT 1;" > "$ref/select1.sql"
for path in socket_nopw plain_nopw tls_nopw reference_plain reference; do
  ms=$("$pgbin/pgbench" -n -C -c 1 -T 10 -f "$ref/select1.sql" "${!path}" 2>/dev/null | awk '/average connection time/ {print $5}')
  echo "  ${path%_nopw}  $ms"
done
echo "  (socket: the sandbox's own 16-iteration verifier; router and reference: 4096 iterations, which libpq computes at every connect)"

echo
echo "## 3. A 50 MB result (COPY to psql), median of $runs runs, ms"
for hog in no yes; do
  [ "$hog" = yes ] && hog_on
  declare -A t=()
  for _ in $(seq "$runs"); do
    t[router_tls]+="$(copy_ms "$tls_nopw" "$password") "
    t[router_plain]+="$(copy_ms "$plain_nopw" "$password") "
    t[plain_pg_tls]+="$(copy_ms "$reference" "$password") "
    t[plain_pg_plain]+="$(copy_ms "$reference_plain" "$password") "
  done
  hog_off
  rt=$(echo ${t[router_tls]} | tr ' ' '\n' | median)
  rp=$(echo ${t[router_plain]} | tr ' ' '\n' | median)
  pt=$(echo ${t[plain_pg_tls]} | tr ' ' '\n' | median)
  pp=$(echo ${t[plain_pg_plain]} | tr ' ' '\n' | median)
  echo "  CPU hog $hog: router TLS $rt, router plaintext $rp, plain PostgreSQL TLS $pt, plain PostgreSQL plaintext $pp;" \
    "router TLS / router plaintext $(python3 -c "print(round($rt/$rp, 2))"), plain PostgreSQL TLS / its plaintext $(python3 -c "print(round($pt/$pp, 2))"), router TLS / plain PostgreSQL TLS $(python3 -c "print(round($rt/$pt, 2))")"
  unset t
done

echo
echo "## 4. pgbench -S (scale 10, 2 clients, 15 s per run, alternating), tps"
# PgBouncer in session mode in front of the sandbox's socket, run as the
# sandbox's own uid (the only one besides root that reaches the socket).
run_dir=$(python3 -c "import sys,urllib.parse as u; print(u.parse_qs(u.urlsplit(sys.argv[1]).query)['host'][0])" "$socket")
uid=$(stat -c %u "$AIRLOCK_HOME/volume/sandboxes/$id/pgdata")
gid=$(stat -c %g "$run_dir")
mkdir -p "$ref/bouncer" && chown "$uid:$gid" "$ref/bouncer"
cat > "$ref/bouncer/pgbouncer.ini" <<EOF
[databases]
app = host=$run_dir dbname=app user=airlock_agent password=$password
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = 7453
auth_type = trust
auth_file = $ref/bouncer/users.txt
pool_mode = session
max_client_conn = 100
default_pool_size = 4
logfile = $ref/bouncer/pgbouncer.log
pidfile = $ref/bouncer/pgbouncer.pid
EOF
echo '"airlock_agent" ""' > "$ref/bouncer/users.txt"
chown "$uid:$gid" "$ref/bouncer/pgbouncer.ini" "$ref/bouncer/users.txt" && chmod 600 "$ref/bouncer/pgbouncer.ini"
setpriv --reuid="$uid" --regid="$gid" --clear-groups pgbouncer -d "$ref/bouncer/pgbouncer.ini" >/dev/null \
  || { echo "pgbouncer did not start:"; cat "$ref/bouncer/pgbouncer.log"; exit 1; }
sleep 1
bouncer="postgresql://airlock_agent@127.0.0.1:7453/app?sslmode=disable"
for round in 1 2; do
  for path in socket_nopw plain_nopw tls_nopw bouncer; do
    tps=$("$pgbin/pgbench" -n -S -c 2 -j 2 -T 15 "${!path}" 2>/dev/null | awk '/^tps/ {print $3}')
    echo "  round $round  ${path%_nopw}  tps=$tps"
  done
done
airlock rm "$id" >/dev/null
} | tee "$out/router-auth.txt"
