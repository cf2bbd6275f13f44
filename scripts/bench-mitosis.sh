#!/usr/bin/env bash
# Airlock against mitosis-db on the same golden and the same filesystem, in the
# same run: from the command line to the first query answered by psql, so both
# tools pay for their CLI and for psql's connection. Needs root, a running Airlock
# daemon at $AIRLOCK_HOME holding golden bench-40mb on a reflink volume, and
# `mitosis` on the PATH (`cargo install mitosis-db`). mitosis refuses to run as
# root, so it runs as the system user airlock-mitosis, with its home on Airlock's
# volume.
set -euo pipefail
cd "$(dirname "$0")/.."

source scripts/bench-lib.sh
iterations=${ITERATIONS:-30}
id airlock-mitosis >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin airlock-mitosis
mhome="$AIRLOCK_HOME/volume/mitosis"
seed=$(mktemp -d)
mkdir -p "$mhome"
chown airlock-mitosis "$mhome"
cp bench/schema.sql bench/seed-40mb.sql "$seed/"
chmod -R a+rX "$seed"
M() { (cd "$seed" && runuser -u airlock-mitosis -- env HOME="$mhome" MITOSIS_HOME="$mhome/home" PATH="$pgbin:$PATH" mitosis "$@"); }
finish() {
  M daemon stop --with-router >/dev/null 2>&1 || true
  pkill -u airlock-mitosis >/dev/null 2>&1 || true
  rm -rf "$mhome" "$seed"
}
trap finish EXIT
now() { date +%s%N; }
# The database name of a URL: for Airlock, the sandbox id; for mitosis, the clone id.
sandbox_of() { echo "$1" | sed -E 's|^[^/]*//[^/]*/([^?]*).*|\1|'; }
ms() { python3 -c "print(round(($2 - $1) / 1e6, 2))"; }

M template init --seed 'psql -q "$DATABASE_URL" -f schema.sql -f seed-40mb.sql' >/dev/null
M clone --ttl 10m >/dev/null   # first clone starts mitosis's daemon and router
results=$(mktemp)
for i in $(seq "$iterations"); do
  t=$(now); url=$(M clone --ttl 10m); "$pgbin/psql" "$url" -XtAc "SELECT 1" >/dev/null; e=$(now)
  echo "mitosis_clone $(ms "$t" "$e")" >> "$results"
  M destroy "$(sandbox_of "$url")" >/dev/null
  t=$(now); url=$(airlock fork bench-40mb --ttl 10m --idle-suspend 0); "$pgbin/psql" "$url" -XtAc "SELECT 1" >/dev/null; e=$(now)
  echo "airlock_fork_cold $(ms "$t" "$e")" >> "$results"
  airlock rm "$(sandbox_of "$url")" >/dev/null
done
airlock golden pool bench-40mb --size 2 >/dev/null
for i in $(seq "$iterations"); do
  while [ "$(airlock golden show bench-40mb --json | python3 -c 'import json,sys; g=json.load(sys.stdin); print(g["pooled"] >= g["pool_size"])')" != True ]; do sleep 0.05; done
  t=$(now); url=$(airlock fork bench-40mb --ttl 10m --idle-suspend 0); "$pgbin/psql" "$url" -XtAc "SELECT 1" >/dev/null; e=$(now)
  echo "airlock_fork_from_pool $(ms "$t" "$e")" >> "$results"
  airlock rm "$(sandbox_of "$url")" >/dev/null
done
airlock golden pool bench-40mb --size 0 >/dev/null
echo "## CLI to first psql answer, same golden, same XFS volume, $iterations runs each (mitosis-db $(M --version | awk '{print $2}'))"
python3 - "$results" <<'PY'
import sys, collections, math
runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    name, v = line.split()
    runs[name].append(float(v))
def rank(v, p):
    return v[min(len(v), max(1, math.ceil(p * len(v)))) - 1]
order = ["airlock_fork_from_pool", "airlock_fork_cold", "mitosis_clone"]
stats = {n: sorted(runs[n]) for n in order}
base = rank(stats["airlock_fork_cold"], 0.5)
print(f"{'METHOD':24} {'RUNS':>4} {'P50 MS':>8} {'P99 MS':>8} {'VS AIRLOCK COLD':>16}")
for name in order:
    v = stats[name]
    print(f"{name:24} {len(v):>4} {rank(v, 0.5):>8.1f} {rank(v, 0.99):>8.1f} {rank(v, 0.5) / base:>15.2f}x")
PY
rm -f "$results"
