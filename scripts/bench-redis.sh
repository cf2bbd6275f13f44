#!/usr/bin/env bash
# Forks of a golden with a Redis part (as root): the same schema with and
# without a Redis part of $KEYS keys (default 1 million), `bench fork` on each
# (cold forks: fork request to first query answered, the fork being ready only
# when its Redis answers too), the same from a warm pool, the memory of an idle
# sandbox Redis, and the baseline of the same run: redis-server started by hand
# on the same RDB file, to its first PING. Then a golden of the Redis part
# alone (no PostgreSQL), the ~1.5 GB PostgreSQL golden with the Redis part from
# the pool (fork to first SQL and first PING both answered), and redis-benchmark
# GET/SET through the router's Redis port (plaintext and TLS) against the same
# sandbox's socket. Results go to bench/results/redis.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" -eq 0 ] || { echo "run as root (it makes a loop volume and runs servers as other users)" >&2; exit 1; }
export AIRLOCK_ROUTER=127.0.0.1:7472 AIRLOCK_GATEWAY=127.0.0.1:7473 AIRLOCK_REDIS_ROUTER=127.0.0.1:7474
export AIRLOCK_HOME=${AIRLOCK_BENCH_HOME:-/var/lib/airlock-bench-redis}
GOLDENS="plain cached kv big"
source scripts/bench-lib.sh
iterations=${ITERATIONS:-20}
keys=${KEYS:-1000000}
bench_fresh_root
work=$(mktemp -d /var/tmp/airlock-bench-redis.XXXXXX)
trap 'bench_cleanup; pkill -f "$work/redis.sock" || true; rm -rf "$work"' EXIT
python3 - "$keys" > "$work/cache.redis" <<'PY'
import sys
for i in range(int(sys.argv[1])):
    print(f"SET session:{i} user-{i}-{'x' * 8}")
PY
{
  echo "# Forks with a Redis part of $keys keys: bench/schema.sql + bench/seed-40mb.sql, $iterations cold forks each"
  echo "# $(date -u +%FT%TZ), $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(uname -r), $(redis-server --version | cut -d' ' -f3)"
  airlock golden create plain --schema "$PWD/bench/schema.sql" --seed "$PWD/bench/seed-40mb.sql" >/dev/null
  began=$(date +%s%N)
  airlock golden create cached --schema "$PWD/bench/schema.sql" --seed "$PWD/bench/seed-40mb.sql" \
    --redis-seed "$work/cache.redis" >/dev/null
  echo "### golden build with the Redis part: $(( ($(date +%s%N) - began) / 1000000 )) ms"
  airlock golden show cached --json | json '["generations"][0]["redis"]'
  echo "### without Redis"
  airlock bench fork --golden plain --iterations "$iterations" --no-baselines
  echo "### with Redis"
  airlock bench fork --golden cached --iterations "$iterations" --no-baselines
  echo "### from the pool (4 members, Redis loaded), without and with Redis"
  airlock golden pool plain --size 4 >/dev/null
  airlock golden pool cached --size 4 >/dev/null
  airlock bench fork --golden plain --iterations "$iterations" --no-baselines
  airlock bench fork --golden cached --iterations "$iterations" --no-baselines
  airlock golden pool plain --size 0 >/dev/null
  airlock golden pool cached --size 0 >/dev/null
  echo "### memory of one idle sandbox Redis (PSS, KiB) and its data set"
  id=$(airlock fork cached --json | json '["id"]')
  pid=$(pgrep -f "$AIRLOCK_HOME/volume/sandboxes/$id/run/redis.sock" | head -1)
  echo "pss_kib $(awk '/^Pss:/ {print $2}' "/proc/$pid/smaps_rollup")"
  airlock rm "$id" >/dev/null
  echo "### a golden of the Redis part alone (no PostgreSQL): cold, then from the pool (to first PING)"
  airlock golden create kv --redis-seed "$work/cache.redis" >/dev/null
  airlock bench fork --golden kv --iterations "$iterations" --no-baselines
  airlock golden pool kv --size 4 >/dev/null
  airlock bench fork --golden kv --iterations "$iterations" --no-baselines
  airlock golden pool kv --size 0 >/dev/null
  echo "### redis-benchmark, GET and SET, 50 clients, 100000 requests each (requests/s and ms)"
  # redis-benchmark takes a password only on its command line: it is this
  # throwaway sandbox's, deleted right after, never a credential anyone uses.
  sb=$(airlock fork cached --ttl 10m --json)
  id=$(echo "$sb" | json '["id"]')
  routed=$(echo "$sb" | json '["redis_url"]')
  password=${routed#*://"$id":}; password=${password%@*}
  socket=$(echo "$sb" | json '["redis_socket_url"]'); socket=${socket#*@}
  host=${AIRLOCK_REDIS_ROUTER%:*}; port=${AIRLOCK_REDIS_ROUTER#*:}
  rb() { redis-benchmark --user "$id" -a "$password" -t get,set -n 100000 -c 50 --csv "$@" 2>/dev/null | tail -n +2; }
  echo '"path","test","rps","avg_ms","min_ms","p50_ms","p95_ms","p99_ms","max_ms"'
  rb -s "$socket" | sed 's/^/"socket",/'
  rb -h "$host" -p "$port" | sed 's/^/"router",/'
  rb -h "$host" -p "$port" --tls --cacert "$AIRLOCK_HOME/tls/ca.crt" | sed 's/^/"router_tls",/'
  airlock rm "$id" >/dev/null
  echo "### the ~1.5 GB PostgreSQL golden with the Redis part, from the pool (4 members): first SQL and first PING"
  airlock golden create big --schema "$PWD/bench/schema.sql" --seed "$PWD/bench/seed-1500mb.sql" \
    --redis-seed "$work/cache.redis" >/dev/null
  airlock golden show big --json | json '["generations"][0]["size_bytes"]'
  airlock golden pool big --size 4 >/dev/null
  airlock bench fork --golden big --iterations "$iterations" --no-baselines
  airlock golden pool big --size 0 >/dev/null
  echo "### baseline: redis-server started by hand on the same RDB, to its first PING (ms)"
  cp "$AIRLOCK_HOME"/volume/goldens/cached/1/redis/dump.rdb "$work/dump.rdb"
  times=()
  for _ in $(seq "$iterations"); do
    began=$(date +%s%N)
    redis-server --port 0 --unixsocket "$work/redis.sock" --dir "$work" --save "" --appendonly no \
      --loglevel warning >/dev/null &
    server=$!
    until [ "$(redis-cli -s "$work/redis.sock" ping 2>/dev/null)" = PONG ]; do sleep 0.001; done
    times+=($(( ($(date +%s%N) - began) / 1000 )))
    kill -9 "$server"; wait "$server" 2>/dev/null || true
    rm -f "$work/redis.sock"
  done
  printf '%s\n' "${times[@]}" | sort -n | awk '{a[NR]=$1} END {printf "median %.1f ms, p99 %.1f ms, n=%d\n", a[int((NR+1)/2)]/1000, a[NR]/1000, NR}'
} | tee "$out/redis.txt"
