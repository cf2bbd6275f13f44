#!/usr/bin/env bash
# The lifecycle at its floor (as root): how soon a restarted daemon answers when
# sandboxes expired while it was down, and how late TTLs are kept while it is
# up. With BASE set to an older binary, each restart round runs it and this
# build in turn, on the same host, in the same run.
#
# Restart: N sandboxes (PostgreSQL and Redis) with a short TTL, the daemon
# killed (SIGKILL), the TTLs left to pass, the daemon started again: the time
# to its API's first answer, and to the last expired sandbox gone. Each is
# measured twice: with the host's pid 1 reaping the servers the dead daemon
# left, and under a parent that never reaps them (as a container's init or a
# busy pid 1 may not), where a deletion that waits for reaping waits forever.
#
# TTL: M sandboxes with TTLs of 20 to 29 s, left to expire while the
# daemon is up; from each deletion's event, how long after its expiry its
# teardown began, and how long after it the sandbox was gone.
# PARTS=restart or PARTS=ttl runs one part. Results go to
# bench/results/lifecycle-PARTS.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" -eq 0 ] || { echo "run as root (it makes a loop volume and runs servers as other users)" >&2; exit 1; }
export AIRLOCK_ROUTER=127.0.0.1:7492 AIRLOCK_GATEWAY=127.0.0.1:7493 AIRLOCK_REDIS_ROUTER=127.0.0.1:7494
export AIRLOCK_HOME=${AIRLOCK_BENCH_HOME:-/var/lib/airlock-bench-lifecycle}
GOLDENS="kv"
source scripts/bench-lib.sh
rounds=${ROUNDS:-3}
expired=${EXPIRED:-20}
ttls=${TTLS:-100}
parts=${PARTS:-restart,ttl}
new=$PWD/target/release/airlock
work=$(mktemp -d /var/tmp/airlock-bench-lifecycle.XXXXXX)
keeper=""
stop_keeper() { if [ -n "$keeper" ]; then kill "$keeper" 2>/dev/null || true; fi; keeper=""; }
trap 'stop_keeper; bench_cleanup || true; rm -rf "$work"' EXIT
bin=$new
airlock() { "$bin" "$@"; }
printf 'CREATE TABLE t (id int);\n' > "$work/schema.sql"
printf 'SET greeting hi\n' > "$work/seed.redis"
now() { date +%s.%N; }

# Starts `serve` in the background; with "unreaping", under a parent that
# adopts whatever the daemon leaves (PR_SET_CHILD_SUBREAPER) and never reaps it.
serve() {
  if [ "$1" = unreaping ]; then
    python3 -c '
import ctypes, subprocess, sys, time
ctypes.CDLL(None).prctl(36, 1)  # PR_SET_CHILD_SUBREAPER
subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).wait()
time.sleep(1e9)' "$bin" serve &
    keeper=$!
  else
    setsid "$bin" serve >/dev/null 2>&1 < /dev/null &
  fi
  until airlock ls >/dev/null 2>&1; do sleep 0.02; done
}

# One restart round: binary $1 named $2, parent $3. Prints name,parent,answer_s,gone_s.
restart_round() {
  bin=$1
  bench_fresh_root
  serve "$3"
  airlock golden create kv --schema "$work/schema.sql" --redis-seed "$work/seed.redis" >/dev/null
  for _ in $(seq "$expired"); do airlock fork kv --ttl 10s >/dev/null; done
  pkill -9 -f "^$bin serve$"
  sleep 11
  local t0 t1 t2
  t0=$(now)
  setsid "$bin" serve >/dev/null 2>&1 < /dev/null &
  until airlock ls >/dev/null 2>&1; do sleep 0.005; done
  t1=$(now)
  until [ "$(airlock ls --json | json '.__len__()')" = 0 ]; do sleep 0.01; done
  t2=$(now)
  echo "$2,$3,$(echo "$t1 - $t0" | bc),$(echo "$t2 - $t0" | bc)"
  stop_keeper
  bench_cleanup
}

# TTL lag with binary $1 named $2: prints name,began_ms,gone_ms per sandbox.
ttl_round() {
  bin=$1
  bench_fresh_root
  serve pid1
  airlock golden create kv --schema "$work/schema.sql" >/dev/null
  # Forks take about a tenth of a second each: TTLs from 20 s on leave them all made first.
  for i in $(seq "$ttls"); do airlock fork kv --ttl "$((20 + i % 10))s" >/dev/null; done
  until [ "$(airlock ls --json | json '.__len__()')" = 0 ]; do sleep 0.5; done
  airlock events --limit 100000 --json | python3 -c '
import json, sys, datetime
def ms(t): return datetime.datetime.fromisoformat(t.replace("Z", "+00:00")).timestamp() * 1000
for e in json.load(sys.stdin):
    if e["kind"] == "deleted" and e.get("reason") == "ttl":
        gone = ms(e["at"]) - ms(e["detail"]["expires_at"])
        began = gone - e["detail"]["delete_ms"]
        print(f"'"$2"',{began:.1f},{gone:.1f}")'
  bench_cleanup
}

{
  echo "# Restart with $expired expired sandboxes, and TTL lag over $ttls sandboxes; this build${BASE:+ against BASE ($BASE)}"
  echo "# $(date -u +%FT%TZ), $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(uname -r)"
  echo "restart,build,parent,answer_s,gone_s"
  for _ in $(seq "$rounds"); do
    [[ $parts == *restart* ]] || break
    for parent in pid1 unreaping; do
      if [ -n "${BASE:-}" ]; then echo "restart,$(restart_round "$BASE" before $parent)"; fi
      echo "restart,$(restart_round "$new" now $parent)"
    done
  done
  echo "ttl,build,began_ms,gone_ms"
  if [[ $parts == *ttl* ]]; then
    if [ -n "${BASE:-}" ]; then ttl_round "$BASE" before | sed 's/^/ttl,/'; fi
    ttl_round "$new" now | sed 's/^/ttl,/'
  fi
} | tee "$work/raw.csv"
python3 - "$work/raw.csv" <<'PY' | tee -a "$work/raw.csv"
import statistics, sys
restart, ttl = {}, {}
for line in open(sys.argv[1]):
    f = line.strip().split(",")
    if f[0] == "restart" and f[1] != "build":
        restart.setdefault((f[1], f[2]), []).append((float(f[3]), float(f[4])))
    if f[0] == "ttl" and f[1] != "build":
        ttl.setdefault(f[1], []).append((float(f[2]), float(f[3])))
def pct(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, int(round(p / 100 * (len(v) - 1))))]
print("\n| build | pid 1 | API answers (median, max) | last expired sandbox gone (median, max) |")
print("|---|---|---|---|")
for (build, parent), v in sorted(restart.items()):
    a, g = [x[0] for x in v], [x[1] for x in v]
    who = "reaps" if parent == "pid1" else "never reaps"
    print(f"| {build} | {who} | {statistics.median(a):.2f} s, {max(a):.2f} s | {statistics.median(g):.2f} s, {max(g):.2f} s |")
print("\n| build | teardown began after expiry: p50 / p99 / max | gone after expiry: p50 / p99 / max |")
print("|---|---|---|")
for build, v in sorted(ttl.items()):
    b, g = [x[0] for x in v], [x[1] for x in v]
    print(f"| {build} ({len(v)}) | {pct(b,50):.0f} / {pct(b,99):.0f} / {max(b):.0f} ms | {pct(g,50):.0f} / {pct(g,99):.0f} / {max(g):.0f} ms |")
PY
mkdir -p bench/results && cp "$work/raw.csv" "bench/results/lifecycle-${parts/,/-}.txt"
