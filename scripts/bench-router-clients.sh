#!/usr/bin/env bash
# The router against the socket and PgBouncer, at several client counts, in
# plaintext and TLS, in one run (as root): `pgbench -S` (scale 10) on one
# sandbox of the 40 MB golden, each path in turn within each round, so a
# load that comes and goes weighs on all alike.
#
# Paths:
#   socket        the sandbox's own unix socket (the ceiling);
#   router        the router's port, plaintext (sslmode=disable);
#   router_tls    the router's port, TLS (sslmode=require);
#   router_unix   the router's unix socket (`serve --router-socket`), for
#                 clients on the host: a session handed to its server runs
#                 over a unix socket end to end;
#   pgbouncer     PgBouncer (session pooling) on loopback in front of the
#                 same socket, plaintext;
#   pgbouncer_tls the same with client TLS (a throwaway self-signed key);
#   bare_socket   a bare PostgreSQL of the same major (no sandbox, no guard)
#                 with the same data, on its unix socket;
#   bare_tcp      the same server over loopback TCP: what a TCP client can get
#                 at best, the floor for the router's port (a plaintext
#                 router session is handed to its server, and so is TCP end to
#                 end).
#   bare_tls      the same server over loopback TCP with its own TLS
#                 (sslmode=require, the same key): what a TLS client can get
#                 at best with no relay at all, the floor for router_tls.
# PgBouncer is installed when missing (apt). CLIENTS (default "2 8 28": an
# agent role holds at most 30 connections, the sandbox's cap),
# ROUNDS (default 3) and SECONDS_EACH (default 8) set the run.
# Results go to bench/results/router-clients.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" -eq 0 ] || { echo "run as root (it makes a loop volume and runs servers as other users)" >&2; exit 1; }
export AIRLOCK_ROUTER=127.0.0.1:7512 AIRLOCK_GATEWAY=127.0.0.1:7513 AIRLOCK_REDIS_ROUTER=127.0.0.1:7514
export AIRLOCK_HOME=${AIRLOCK_BENCH_HOME:-/var/lib/airlock-bench-router-clients}
export AIRLOCK_ROUTER_SOCKET=/run/airlock-bench-router-clients
GOLDENS="bench-40mb"
source scripts/bench-lib.sh
clients=${CLIENTS:-2 8 28}
rounds=${ROUNDS:-3}
seconds=${SECONDS_EACH:-8}
command -v pgbouncer >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -q pgbouncer >/dev/null
work=$(mktemp -d /var/tmp/airlock-bench-router-clients.XXXXXX)
chmod 700 "$work"
# PgBouncer is stopped by its configuration's path: runuser, which starts
# it, does not pass a signal on.
# bench_fresh_root sets its own exit trap: this one, which includes it, comes after.
bench_fresh_root
trap 'pkill -f "pgbouncer $work/pgbouncer.ini" 2>/dev/null || true; runuser -u airlock -- "$pgbin/pg_ctl" -D "$work/bare/data" -m immediate stop >/dev/null 2>&1 || true; bench_cleanup || true; rm -rf "$work" "$AIRLOCK_ROUTER_SOCKET"' EXIT
airlock golden create bench-40mb --schema bench/schema.sql --seed bench/seed-40mb.sql >/dev/null
sb=$(airlock fork bench-40mb --json --ttl 2h --idle-suspend 0 --connection-limit 30)
id=$(echo "$sb" | json "['id']")
# The sandbox's password goes to the clients in PGPASSWORD, never on a
# command line (every local user can read those); the DSNs name the user alone.
without_password() { python3 -c 'import json, sys, urllib.parse as u
d = u.urlsplit(json.load(sys.stdin)[sys.argv[1]])
user, host = d.netloc.rsplit("@", 1)
print(d._replace(netloc=user.split(":", 1)[0] + "@" + host).geturl())' "$1" <<<"$sb"; }
socket=$(without_password socket_dsn)
routed=$(without_password dsn)
PGPASSWORD=$(python3 -c 'import json, sys, urllib.parse as u; print(u.unquote(u.urlsplit(json.load(sys.stdin)["dsn"]).password))' <<<"$sb")
export PGPASSWORD
run_dir=$AIRLOCK_HOME/volume/sandboxes/$id/run
"$pgbin/pgbench" -i -s 10 -q "$socket" >/dev/null 2>&1

# PgBouncer runs as the sandbox's second uid, the one `exec` code runs as
# (it refuses root): the sandbox's socket lets its group in, and its server
# lets that uid log in as the agent by peer authentication.
exec_uid=$(( $(stat -c %u "$AIRLOCK_HOME/volume/sandboxes/$id/pgdata") + 1 ))
openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=localhost \
  -keyout "$work/key.pem" -out "$work/cert.pem" >/dev/null 2>&1
(umask 077; printf '"airlock_agent" "%s"\n' "$PGPASSWORD" > "$work/userlist.txt")
cat > "$work/pgbouncer.ini" <<EOF
[databases]
app = host=$run_dir port=5432 dbname=app
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = 7519
unix_socket_dir =
auth_type = scram-sha-256
auth_file = $work/userlist.txt
pool_mode = session
; its server connections close once idle, so each path gets the sandbox's
; 30 connections to itself
server_idle_timeout = 1
max_client_conn = 200
default_pool_size = 40
client_tls_sslmode = allow
client_tls_key_file = $work/key.pem
client_tls_cert_file = $work/cert.pem
logfile = $work/pgbouncer.log
pidfile = $work/pgbouncer.pid
EOF
chown -R "$exec_uid:$exec_uid" "$work"
chmod 711 "$work"
setpriv --reuid="$exec_uid" --regid="$exec_uid" --clear-groups pgbouncer "$work/pgbouncer.ini" >/dev/null 2>&1 &
sleep 1
# The bare server: trust on its own socket and loopback, for the floor alone.
mkdir -p "$work/bare" && chown airlock "$work/bare"
runuser -u airlock -- "$pgbin/initdb" -D "$work/bare/data" -U airlock_agent --auth=trust >/dev/null
install -o airlock -m 0600 "$work/key.pem" "$work/bare/key.pem"
install -o airlock -m 0644 "$work/cert.pem" "$work/bare/cert.pem"
runuser -u airlock -- "$pgbin/pg_ctl" -D "$work/bare/data" -l "$work/bare/log" -w start \
  -o "-c listen_addresses=127.0.0.1 -p 7521 -c unix_socket_directories=$work/bare -c ssl=on -c ssl_cert_file=$work/bare/cert.pem -c ssl_key_file=$work/bare/key.pem" >/dev/null
"$pgbin/createdb" -h "$work/bare" -p 7521 -U airlock_agent app
"$pgbin/pgbench" -i -s 10 -q -h "$work/bare" -p 7521 -U airlock_agent app >/dev/null 2>&1
plain_router="${routed%%\?*}?sslmode=disable"
tls_router="${routed%%\?*}?sslmode=require"
unix_router="postgresql://airlock_agent@/$id?host=$AIRLOCK_ROUTER_SOCKET&port=${AIRLOCK_ROUTER##*:}"
plain_bouncer="postgresql://airlock_agent@127.0.0.1:7519/app?sslmode=disable"
tls_bouncer="postgresql://airlock_agent@127.0.0.1:7519/app?sslmode=require"
bare_socket="postgresql://airlock_agent@/app?host=$work/bare&port=7521"
bare_tcp="postgresql://airlock_agent@127.0.0.1:7521/app?sslmode=disable"
bare_tls="postgresql://airlock_agent@127.0.0.1:7521/app?sslmode=require"
declare -A dsn=([socket]=$socket [router]=$plain_router [router_tls]=$tls_router [router_unix]=$unix_router [pgbouncer]=$plain_bouncer [pgbouncer_tls]=$tls_bouncer [bare_socket]=$bare_socket [bare_tcp]=$bare_tcp [bare_tls]=$bare_tls)
paths="socket router router_tls router_unix pgbouncer pgbouncer_tls bare_socket bare_tcp bare_tls"
for path in $paths; do
  "$pgbin/pgbench" -n -S -c 1 -T 1 "${dsn[$path]}" >/dev/null 2>&1 || { echo "$path does not answer" >&2; exit 1; }
done

{
  echo "# pgbench -S, scale 10, ${seconds} s per run, $rounds rounds; $(date -u +%FT%TZ), $(nproc) cores, $(uname -r), $(pgbouncer --version | head -1)"
  echo "round,clients,path,tps"
  for round in $(seq "$rounds"); do
    for c in $clients; do
      for path in $paths; do
        sleep 2
        tps=$("$pgbin/pgbench" -n -S -c "$c" -j "$(( c < 2 ? c : 2 ))" -T "$seconds" "${dsn[$path]}" 2>/dev/null | awk '/^tps/ {print $3}')
        echo "$round,$c,$path,$tps"
      done
    done
  done
} | tee "$work/raw.csv"
python3 - "$work/raw.csv" "$paths" <<'PY' | tee -a "$work/raw.csv"
import statistics, sys
rows = [l.strip().split(",") for l in open(sys.argv[1]) if l[0].isdigit()]
paths = sys.argv[2].split()
clients = sorted({int(r[1]) for r in rows})
med = {(c, p): statistics.median(float(r[3]) for r in rows if int(r[1]) == c and r[2] == p) for c in clients for p in paths}
print("\n| clients | " + " | ".join(paths) + " | router / socket | router_tls / socket | router_unix / socket | router / pgbouncer | router_tls / pgbouncer_tls | bare_tcp / bare_socket (TCP's floor) | bare_tls / bare_socket (TLS's floor) | router_tls / bare_tls |")
print("|---" * (len(paths) + 9) + "|")
for c in clients:
    s = med[(c, "socket")]
    cells = " | ".join(f"{med[(c, p)]:,.0f}" for p in paths)
    print(f"| {c} | {cells} | {med[(c,'router')]/s:.2f} | {med[(c,'router_tls')]/s:.2f} | {med[(c,'router_unix')]/s:.2f} | "
          f"{med[(c,'router')]/med[(c,'pgbouncer')]:.2f} | {med[(c,'router_tls')]/med[(c,'pgbouncer_tls')]:.2f} | "
          f"{med[(c,'bare_tcp')]/med[(c,'bare_socket')]:.2f} | {med[(c,'bare_tls')]/med[(c,'bare_socket')]:.2f} | "
          f"{med[(c,'router_tls')]/med[(c,'bare_tls')]:.2f} |")
PY
cp "$work/raw.csv" bench/results/router-clients.txt
