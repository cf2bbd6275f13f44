#!/usr/bin/env bash
# Router, pool and suspend benchmarks (run after scripts/bench.sh or on
# their own): sustained fork-query-delete rate with the pool refilling, pgbench -S
# through the router against the sandbox's socket in the same run, wake time,
# memory per idle sandbox, and mitosis-db side by side when it is installed.
# Results go to bench/results/router.txt.
set -euo pipefail
cd "$(dirname "$0")/.."

export AIRLOCK_HOME=${AIRLOCK_BENCH_HOME:-/var/lib/airlock-bench-router}
# Limits for the daemon the CLI starts (the memory run holds 40 sandboxes).
export AIRLOCK_MAX_RUNNING=200 AIRLOCK_MAX_SANDBOXES=400 AIRLOCK_ROUTER=127.0.0.1:7435 AIRLOCK_GATEWAY=127.0.0.1:7436
GOLDENS=bench-40mb
source scripts/bench-lib.sh
bench_fresh_root
airlock golden create bench-40mb --schema bench/schema.sql --seed bench/seed-40mb.sql >/dev/null

{
echo "# $(date -u +%Y-%m-%dT%H:%MZ) on $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB, $(uname -r)"
echo
echo "## Fork through the router: cold, and from a pool of 4"
airlock bench fork --golden bench-40mb --iterations 30 --no-baselines
airlock bench fork --golden bench-40mb --iterations 30 --no-baselines --via socket
airlock golden pool bench-40mb --size 4 >/dev/null
airlock bench fork --golden bench-40mb --iterations 30 --no-baselines
airlock bench fork --golden bench-40mb --iterations 30 --no-baselines --via socket
echo
echo "## Sustained fork, first query and delete for 60 s, 2 clients, pool of 4 refilling"
airlock bench churn --golden bench-40mb --duration 60s --clients 2
airlock golden pool bench-40mb --size 0 >/dev/null
echo
echo "## Wake"
airlock bench wake --golden bench-40mb --iterations 20
echo
echo "## pgbench -S (scale 10, 2 clients, 15 s per run, alternating), socket vs router"
sb=$(airlock fork bench-40mb --json --ttl 1h --idle-suspend 0)
socket=$(echo "$sb" | json "['socket_dsn']")
routed=$(echo "$sb" | json "['dsn']")
plain="${routed%%\?*}?sslmode=disable"
"$pgbin/pgbench" -i -s 10 -q "$socket" >/dev/null 2>&1
for round in 1 2; do
  for path in socket plain routed; do
    tps=$("$pgbin/pgbench" -n -S -c 2 -j 2 -T 15 "${!path}" 2>/dev/null | awk '/^tps/ {print $3}')
    echo "round $round  $path  tps=$tps"
  done
done
echo "connect time (pgbench -C -S, 1 client, 10 s):"
for path in socket plain routed; do
  ms=$("$pgbin/pgbench" -n -C -S -c 1 -T 10 "${!path}" 2>/dev/null | awk '/average connection time/ {print $5}')
  echo "  $path  ${ms} ms"
done
airlock rm "$(echo "$sb" | json "['id']")" >/dev/null
echo
echo "## Density: 40 idle sandboxes"
free_before=$(free -m | awk '/Mem:/ {print $3}')
ids=()
for i in $(seq 40); do ids+=("$(airlock fork bench-40mb --json --idle-suspend 0 | json "['id']")"); done
sleep 5
pss=$(sandbox_pss_kb)
free_after=$(free -m | awk '/Mem:/ {print $3}')
echo "PSS of all sandbox processes: $((pss / 1024)) MiB, $((pss / 40 / 1024)) MiB per idle sandbox"
echo "host used memory grew by $((free_after - free_before)) MiB for 40 sandboxes"
vol_before=$(df -m --output=used "$AIRLOCK_HOME/volume" | tail -1)
airlock suspend "${ids[@]}" >/dev/null
echo "after suspending all 40: $(pgrep -fc "postgres -D $AIRLOCK_HOME/volume/sandboxes/" || true) postmasters left, host used memory $(free -m | awk '/Mem:/ {print $3}') MiB (was $free_after)"
echo "volume in use: ${vol_before} MiB for the golden and 40 sandboxes"
airlock rm "${ids[@]}" >/dev/null
} | tee "$out/router.txt"

if command -v mitosis >/dev/null 2>&1 && [ "$(id -u)" -eq 0 ]; then
  scripts/bench-mitosis.sh | tee -a "$out/router.txt"
fi
