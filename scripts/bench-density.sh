#!/usr/bin/env bash
# Density: how many sandboxes this host holds. Forks N idle sandboxes (default 200)
# and measures their memory; suspends them all and measures what that gives back;
# forks N more, so N suspended and N running sandboxes are held at once, and checks
# every one of them answers through the router (waking the suspended ones, with the
# least recently used running ones suspended to make room). Results go to
# bench/results/density.txt.
set -euo pipefail
cd "$(dirname "$0")/.."

n=${DENSITY:-200}
export AIRLOCK_HOME=${AIRLOCK_BENCH_HOME:-/var/lib/airlock-bench-density}
export AIRLOCK_MAX_RUNNING=$n AIRLOCK_MAX_SANDBOXES=$((2 * n)) AIRLOCK_ROUTER=127.0.0.1:7434 AIRLOCK_GATEWAY=127.0.0.1:7437
GOLDENS=bench-40mb
source scripts/bench-lib.sh
bench_fresh_root
airlock golden create bench-40mb --schema bench/schema.sql --seed bench/seed-40mb.sql >/dev/null
used_mb() { free -m | awk '/Mem:/ {print $3}'; }
volume_mb() { df -m --output=used "$AIRLOCK_HOME/volume" | tail -1 | tr -d ' '; }
servers() { pgrep -fc "postgres -D $AIRLOCK_HOME/volume/sandboxes/" || true; }

{
echo "# $(date -u +%Y-%m-%dT%H:%MZ) on $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB, $(uname -r)"
echo "## Density: $n idle running sandboxes, then $n suspended and $n running at once"
mem0=$(used_mb); vol0=$(volume_mb)
t=$(date +%s)
first=()
for _ in $(seq "$n"); do first+=("$(airlock fork bench-40mb --json --idle-suspend 0 --ttl 1h | json "['id']")"); done
echo "forked $n in $(( $(date +%s) - t )) s"
sleep 5
pss=$(sandbox_pss_kb)
mem1=$(used_mb)
echo "$n running: $(servers) servers, PSS $((pss / 1024)) MiB ($((pss / n / 1024)) MiB each), host used memory +$((mem1 - mem0)) MiB ($(( (mem1 - mem0) / n )) MiB each)"
t=$(date +%s)
airlock suspend "${first[@]}" >/dev/null
mem2=$(used_mb)
echo "suspended all $n in $(( $(date +%s) - t )) s: $(servers) servers left, host used memory back to +$((mem2 - mem0)) MiB"
second=()
for _ in $(seq "$n"); do second+=("$(airlock fork bench-40mb --json --idle-suspend 0 --ttl 1h | json "['id']")"); done
states=$(airlock ls --json | python3 -c "import json,sys,collections; print(dict(collections.Counter(s['state'] for s in json.load(sys.stdin))))")
echo "held at once: $states, $(servers) servers, host used memory +$(( $(used_mb) - mem0 )) MiB, volume +$(( $(volume_mb) - vol0 )) MiB ($(( ($(volume_mb) - vol0) / (2 * n) )) MiB per sandbox)"
t=$(date +%s%N)
bad=0
for id in "${first[@]}" "${second[@]}"; do
  [ "$("$pgbin/psql" "$(airlock dsn "$id")" -XtAc 'SELECT 1' 2>/dev/null)" = 1 ] || bad=$((bad + 1))
done
echo "all $((2 * n)) answered through the router except $bad, in $(( ($(date +%s%N) - t) / 1000000 )) ms (the first $n woken, each suspending the least recently used)"
airlock rm "${first[@]}" "${second[@]}" >/dev/null
} | tee "$out/density.txt"
