#!/usr/bin/env bash
# The router's Redis port against an older build's (as root): redis-benchmark
# GET and SET through each, plaintext, TLS and pipelined (16 commands a
# write, the case the router's command framing works hardest at), in
# alternating rounds on one small sandbox each, with the sandbox's own socket
# as the baseline of the same round. BASE is the older build's binary.
# Results go to bench/results/redis-relay.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" -eq 0 ] || { echo "run as root (it makes a loop volume and runs servers as other users)" >&2; exit 1; }
: "${BASE:?set BASE to an older airlock binary}"
export AIRLOCK_ROUTER=127.0.0.1:7482 AIRLOCK_GATEWAY=127.0.0.1:7483 AIRLOCK_REDIS_ROUTER=127.0.0.1:7484
export AIRLOCK_HOME=${AIRLOCK_BENCH_HOME:-/var/lib/airlock-bench-relay}
GOLDENS="kv"
source scripts/bench-lib.sh
rounds=${ROUNDS:-3}
requests=${REQUESTS:-100000}
new=$PWD/target/release/airlock
work=$(mktemp -d /var/tmp/airlock-bench-relay.XXXXXX)
trap 'bench_cleanup; rm -rf "$work"' EXIT
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
  rb() { redis-benchmark --user "$id" -a "$password" -t get,set -n "$requests" -c 50 --csv "$@" 2>/dev/null | tail -n +2; }
  rb -s "$socket" | sed "s/^/\"$name\",\"socket\",/"
  rb -h "$host" -p "$port" | sed "s/^/\"$name\",\"router\",/"
  rb -h "$host" -p "$port" --tls --cacert "$AIRLOCK_HOME/tls/ca.crt" | sed "s/^/\"$name\",\"router_tls\",/"
  rb -h "$host" -p "$port" -P 16 | sed "s/^/\"$name\",\"router_pipelined\",/"
  bench_cleanup
}

{
  echo "# The router's Redis port, this build against BASE ($BASE): $rounds alternating rounds, $requests requests, 50 clients"
  echo "# $(date -u +%FT%TZ), $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(uname -r), $(redis-server --version | cut -d' ' -f3)"
  echo '"build","path","test","rps","avg_ms","min_ms","p50_ms","p95_ms","p99_ms","max_ms"'
  for _ in $(seq "$rounds"); do
    round "$BASE" base
    round "$new" new
  done
} | tee "$work/raw.csv"
python3 - "$work/raw.csv" <<'PY' | tee -a "$work/raw.csv"
import csv, statistics, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if r and not r[0].startswith("#") and r[0] != "build"]
print("### medians over the rounds: requests/s (p50 / p99 ms), and new/base")
for path in ("socket", "router", "router_tls", "router_pipelined"):
    for test in ("SET", "GET"):
        got = {}
        for build in ("base", "new"):
            sel = [r for r in rows if r[0] == build and r[1] == path and r[2] == test]
            got[build] = (statistics.median(float(r[3]) for r in sel),
                          statistics.median(float(r[6]) for r in sel),
                          statistics.median(float(r[8]) for r in sel))
        b, n = got["base"], got["new"]
        print(f"{path:17} {test}: base {b[0]:9.0f} ({b[1]:.2f} / {b[2]:.2f})  new {n[0]:9.0f} ({n[1]:.2f} / {n[2]:.2f})  ratio {n[0] / b[0]:.3f}")
PY
cp "$work/raw.csv" bench/results/redis-relay.txt
