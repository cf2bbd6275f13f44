#!/usr/bin/env bash
# The router's Redis port (as root): redis-benchmark GET and SET through it,
# plaintext, TLS and pipelined (16 commands a write, the case the router's
# command framing works hardest at), on one small sandbox a round, with the
# sandbox's own socket as the baseline of the same round. Each round also
# runs a bare redis-server (no sandbox, no router) on its unix socket and on
# loopback TCP: their ratio is what TCP itself costs against a unix socket on
# this host, the floor for any client of a TCP port. BASE, if set, is an
# older build's binary, run in alternating rounds with this one. CLIENTS
# (default 50) is how many clients redis-benchmark runs.
# Results go to bench/results/redis-relay.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" -eq 0 ] || { echo "run as root (it makes a loop volume and runs servers as other users)" >&2; exit 1; }
BASE=${BASE:-}
export AIRLOCK_ROUTER=127.0.0.1:7482 AIRLOCK_GATEWAY=127.0.0.1:7483 AIRLOCK_REDIS_ROUTER=127.0.0.1:7484
export AIRLOCK_HOME=${AIRLOCK_BENCH_HOME:-/var/lib/airlock-bench-relay}
GOLDENS="kv"
source scripts/bench-lib.sh
rounds=${ROUNDS:-3}
requests=${REQUESTS:-100000}
clients=${CLIENTS:-50}
new=$PWD/target/release/airlock
work=$(mktemp -d /var/tmp/airlock-bench-relay.XXXXXX)
# The bare server runs as the unprivileged airlock user, in a directory of
# its own, with a throwaway password: a root Redis open on loopback would be
# anyone's to write files with while the round runs.
bare_pass=$(head -c 24 /dev/urandom | base64 | tr -d '/+=')
export REDISCLI_AUTH=$bare_pass
bare_stop() { redis-cli -s "$work/bare/bare.sock" shutdown nosave >/dev/null 2>&1 || true; }
trap 'bench_cleanup; bare_stop; rm -rf "$work"' EXIT
printf 'SET greeting hi\n' > "$work/seed.redis"
host=${AIRLOCK_REDIS_ROUTER%:*}; port=${AIRLOCK_REDIS_ROUTER#*:}
bin=$new
airlock() { "$bin" "$@"; }

# One round with the binary $1 named $2: a fresh root, a Redis-only golden,
# one sandbox, and redis-benchmark on each path.
round() {
  bin=$1
  local name=$2
  bench_fresh_root
  airlock golden create kv --redis-seed "$work/seed.redis" >/dev/null
  local sb id routed password socket
  sb=$(airlock fork kv --ttl 10m --json)
  id=$(echo "$sb" | json '["id"]')
  routed=$(echo "$sb" | json '["redis_url"]')
  # redis-benchmark takes a password only on its command line: it is this
  # throwaway sandbox's, deleted with the root right after.
  password=${routed#*://"$id":}; password=${password%@*}
  socket=$(echo "$sb" | json '["redis_socket_url"]'); socket=${socket#*@}
  rb() { redis-benchmark --user "$id" -a "$password" -t get,set -n "$requests" -c "$clients" --csv "$@" 2>/dev/null | tail -n +2; }
  rb -s "$socket" | sed "s/^/\"$name\",\"socket\",/"
  rb -h "$host" -p "$port" | sed "s/^/\"$name\",\"router\",/"
  rb -h "$host" -p "$port" --tls --cacert "$AIRLOCK_HOME/tls/ca.crt" | sed "s/^/\"$name\",\"router_tls\",/"
  rb -h "$host" -p "$port" -P 16 | sed "s/^/\"$name\",\"router_pipelined\",/"
  bench_cleanup
  # The bare server (its password goes on redis-benchmark's command line,
  # as the sandbox's does above: it dies with the round).
  install -d -o airlock -m 700 "$work/bare"
  chmod 711 "$work"
  runuser -u airlock -- redis-server --port 7485 --bind 127.0.0.1 --unixsocket "$work/bare/bare.sock" \
    --requirepass "$bare_pass" --save '' --appendonly no --dir "$work/bare" --daemonize yes \
    --logfile "$work/bare/bare.log" >/dev/null
  until redis-cli -s "$work/bare/bare.sock" ping >/dev/null 2>&1; do sleep 0.05; done
  redis-cli -s "$work/bare/bare.sock" set greeting hi >/dev/null
  local rbare='redis-benchmark -a '"$bare_pass"' -t get,set -n '"$requests"' -c '"$clients"' --csv'
  $rbare -s "$work/bare/bare.sock" 2>/dev/null | tail -n +2 | sed "s/^/\"$name\",\"bare_socket\",/"
  $rbare -h 127.0.0.1 -p 7485 2>/dev/null | tail -n +2 | sed "s/^/\"$name\",\"bare_tcp\",/"
  bare_stop
}

{
  echo "# The router's Redis port${BASE:+, this build against BASE ($BASE)}: $rounds rounds, $requests requests, $clients clients"
  echo "# $(date -u +%FT%TZ), $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(uname -r), $(redis-server --version | cut -d' ' -f3)"
  echo '"build","path","test","rps","avg_ms","min_ms","p50_ms","p95_ms","p99_ms","max_ms"'
  for _ in $(seq "$rounds"); do
    if [ -n "$BASE" ]; then round "$BASE" base; fi
    round "$new" new
  done
} | tee "$work/raw.csv"
python3 - "$work/raw.csv" <<'PY' | tee -a "$work/raw.csv"
import csv, statistics, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if r and not r[0].startswith("#") and r[0] != "build"]
builds = [b for b in ("base", "new") if any(r[0] == b for r in rows)]
print("### medians over the rounds: requests/s (p50 / p99 ms)" + (", and new/base" if len(builds) == 2 else ""))
rps = {}
for path in ("socket", "router", "router_tls", "router_pipelined", "bare_socket", "bare_tcp"):
    for test in ("SET", "GET"):
        line = f"{path:17} {test}:"
        for build in builds:
            sel = [r for r in rows if r[0] == build and r[1] == path and r[2] == test]
            got = (statistics.median(float(r[3]) for r in sel),
                   statistics.median(float(r[6]) for r in sel),
                   statistics.median(float(r[8]) for r in sel))
            rps[build, path, test] = got[0]
            line += f"  {build} {got[0]:9.0f} ({got[1]:.2f} / {got[2]:.2f})"
        if len(builds) == 2:
            line += f"  ratio {rps['new', path, test] / rps['base', path, test]:.3f}"
        print(line)
print("### this build: the router against the sandbox's socket, and TCP's own floor (bare TCP / bare socket)")
for test in ("SET", "GET"):
    r = lambda p: rps["new", p, test]
    print(f"{test}: router / socket {r('router') / r('socket'):.2f}, router TLS / socket {r('router_tls') / r('socket'):.2f}, "
          f"TCP's floor {r('bare_tcp') / r('bare_socket'):.2f}, router / bare TCP {r('router') / r('bare_tcp'):.2f}")
PY
cp "$work/raw.csv" bench/results/redis-relay.txt
