#!/usr/bin/env bash
# Two builds of Airlock side by side, on one data root and one volume, taking
# turns: cold forks, pooled forks, the floor (a second connection and query on
# a forked sandbox), and pgbench -S through the router. For a change that must
# not move speed (a refactoring), run it with the binary before and after:
#
#   scripts/bench-compare.sh OLD_BINARY NEW_BINARY [ROUNDS]
#
# With SEPARATE_GOLDENS=1, each build forks a golden it made itself
# (bench-40mb-a, bench-40mb-b), for a change in what a golden holds; the
# other build's golden keeps no pool meanwhile.
#
# Each round runs both builds in turn (A then B, then B then A in the next
# round, so neither always goes first); results go to
# bench/results/compare.txt, with the medians and p99 of every round and the
# ratio of B's to A's.
set -euo pipefail
cd "$(dirname "$0")/.."

old=$(readlink -f "$1")
new=$(readlink -f "$2")
rounds=${3:-4}
export AIRLOCK_HOME=${AIRLOCK_BENCH_HOME:-/var/lib/airlock-bench-compare}
export AIRLOCK_ROUTER=127.0.0.1:7437 AIRLOCK_GATEWAY=127.0.0.1:7438
GOLDENS=bench-40mb
current=$new
# bench-lib's helpers run ./target/release/airlock; here they run the build whose turn it is.
source scripts/bench-lib.sh
airlock() { "$current" "$@"; }
bench_fresh_root
make_golden() {
  airlock golden create "$1" --schema bench/schema.sql --seed bench/seed-40mb.sql >/dev/null
  airlock golden pool "$1" --size 0 >/dev/null
}
if [ "${SEPARATE_GOLDENS:-0}" = 1 ]; then
  make_golden bench-40mb-b
  current=$old
  airlock daemon stop --with-router >/dev/null 2>&1 || true
  airlock doctor >/dev/null
  make_golden bench-40mb-a
else
  make_golden bench-40mb
fi

# Stops the daemon and its router, so the next build starts its own.
switch_to() {
  airlock daemon stop --with-router >/dev/null 2>&1 || true
  current=$1
  airlock doctor >/dev/null
}

# One build's figures: cold forks, the floor, pooled forks, pgbench -S through the router.
measure() {
  local name=$1 golden=bench-40mb
  if [ "${SEPARATE_GOLDENS:-0}" = 1 ]; then golden=bench-40mb-$(echo "${name##*-}" | tr AB ab); fi
  cold=$(airlock bench fork --golden "$golden" --iterations 30 --no-baselines --json)
  airlock golden pool "$golden" --size 4 >/dev/null
  pooled=$(airlock bench fork --golden "$golden" --iterations 30 --no-baselines --json)
  airlock golden pool "$golden" --size 0 >/dev/null
  sb=$(airlock fork "$golden" --json --ttl 1h --idle-suspend 0)
  routed=$(echo "$sb" | json "['dsn']")
  socket=$(echo "$sb" | json "['socket_dsn']")
  "$pgbin/pgbench" -i -s 10 -q "$socket" >/dev/null 2>&1
  tps2=$("$pgbin/pgbench" -n -S -c 2 -j 2 -T 10 "$routed" 2>/dev/null | awk '/^tps/ {print $3}')
  tps8=$("$pgbin/pgbench" -n -S -c 8 -j 2 -T 10 "$routed" 2>/dev/null | awk '/^tps/ {print $3}')
  airlock rm "$(echo "$sb" | json "['id']")" >/dev/null
  python3 - "$name" "$cold" "$pooled" "$tps2" "$tps8" <<'EOF'
import json, sys
name, cold, pooled, tps2, tps8 = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3]), sys.argv[4], sys.argv[5]
def pick(report, key):
    # The first series is the fork itself (its name says cold or pooled); the floor's names it.
    results = report.get("results", [])
    if key == "fork":
        return results[0] if results else None
    return next((s for s in results if key in s.get("method", "")), None)
def line(label, report, key):
    s = pick(report, key)
    if s:
        print(f"{name}\t{label}\tp50={s['p50_ms']:.1f}\tp99={s['p99_ms']:.1f}")
line("cold fork", cold, "fork")
line("floor", cold, "floor")
line("pooled fork", pooled, "fork")
print(f"{name}\trouter pgbench -S 2 clients\ttps={tps2}")
print(f"{name}\trouter pgbench -S 8 clients\ttps={tps8}")
EOF
}

{
  echo "# $(date -u +%Y-%m-%dT%H:%MZ) on $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB, $(uname -r)"
  echo "# A = $old"
  echo "# B = $new"
  for round in $(seq "$rounds"); do
    if [ $((round % 2)) -eq 1 ]; then order="A B"; else order="B A"; fi
    for which in $order; do
      if [ "$which" = A ]; then switch_to "$old"; else switch_to "$new"; fi
      measure "round$round-$which"
    done
  done
} | tee "$out/compare.txt"

python3 - "$out/compare.txt" <<'EOF' | tee -a "$out/compare.txt"
import re, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    if line.startswith("#") or "\t" not in line:
        continue
    who, what, *figures = line.rstrip("\n").split("\t")
    build = who.split("-")[-1]
    for f in figures:
        k, v = f.split("=")
        try:
            rows.setdefault((what, k), {}).setdefault(build, []).append(float(v))
        except ValueError:
            pass
print("\n## medians over the rounds (B / A)")
for (what, k), by in rows.items():
    a, b = statistics.median(by.get("A", [0])), statistics.median(by.get("B", [0]))
    ratio = b / a if a else float("nan")
    print(f"{what:32} {k:4}  A={a:9.1f}  B={b:9.1f}  B/A={ratio:.3f}")
EOF
