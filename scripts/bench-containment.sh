#!/usr/bin/env bash
# What containment costs and how far it scales (as root):
#  1. cold and pooled forks of the 40 MB golden on a Btrfs volume (a subvolume with
#     a quota per sandbox) and on an XFS volume (reflinks only), in the same run;
#     With BASE=/path/to/an/older/airlock, the same forks with that binary on both
#     first (the cost of this containment, measured in the same run);
#  2. identities: HOLD sandboxes (default 5000) held at once, most of them
#     suspended (--max-running 20), each with its own leased uid pair; forks are
#     timed at the start and at the end, and every uid is checked to be distinct.
# Results go to bench/results/containment.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" -eq 0 ] || { echo "run as root (it makes loop volumes and leases uids)" >&2; exit 1; }

iterations=${ITERATIONS:-30}
hold=${HOLD:-5000}
export AIRLOCK_ROUTER=127.0.0.1:7444 AIRLOCK_GATEWAY=127.0.0.1:7447
export AIRLOCK_HOME=${AIRLOCK_BENCH_HOME:-/var/lib/airlock-bench-containment}
GOLDENS=bench-40mb
source scripts/bench-lib.sh

fresh() {
  bench_cleanup
  airlock storage init --fs "$1" --size "$2" >/dev/null
}
trap bench_cleanup EXIT

{
echo "# $(date -u +%Y-%m-%dT%H:%MZ) on $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB, $(uname -r)"
if [ -n "${BASE:-}" ]; then
  airlock() { "$BASE" "$@"; }
  for fs in btrfs xfs; do
    fresh "$fs" 20G
    airlock golden create bench-40mb --schema bench/schema.sql --seed bench/seed-40mb.sql >/dev/null
    echo "## base ($BASE) on $fs"
    airlock bench fork --golden bench-40mb --iterations "$iterations" --no-baselines
    airlock golden pool bench-40mb --size 4 >/dev/null
    airlock bench fork --golden bench-40mb --iterations "$iterations" --no-baselines
    airlock golden pool bench-40mb --size 0 >/dev/null
  done
  bench_cleanup
  airlock() { ./target/release/airlock "$@"; }
fi
for fs in btrfs xfs; do
  fresh "$fs" 20G
  airlock golden create bench-40mb --schema bench/schema.sql --seed bench/seed-40mb.sql >/dev/null
  echo "## $fs: $(airlock doctor --json | json "['storage_backend']"), quota per sandbox $(airlock doctor --json | json "['disk_quota_per_sandbox']")"
  airlock bench fork --golden bench-40mb --iterations "$iterations" --no-baselines
  airlock golden pool bench-40mb --size 4 >/dev/null
  airlock bench fork --golden bench-40mb --iterations "$iterations" --no-baselines
  airlock golden pool bench-40mb --size 0 >/dev/null
done

echo "## identities: $hold sandboxes held at once (at most 20 running)"
airlock daemon stop --with-router >/dev/null
export AIRLOCK_MAX_RUNNING=20 AIRLOCK_MAX_SANDBOXES=$((hold + 10)) AIRLOCK_DISK_RESERVE=1G
fresh xfs 60G
airlock golden create bench-40mb --schema bench/schema.sql --seed bench/seed-40mb.sql >/dev/null
leases_before=$(ls /var/lib/airlock-identities | wc -l)
t=$(date +%s)
for i in $(seq "$hold"); do
  airlock fork bench-40mb --ttl 2h --idle-suspend 0 --json >/dev/null
  if [ $((i % 500)) -eq 0 ]; then echo "  $i held after $(( $(date +%s) - t )) s"; fi
done
echo "held $hold in $(( $(date +%s) - t )) s"
airlock bench fork --golden bench-40mb --iterations "$iterations" --no-baselines
python3 - "$AIRLOCK_HOME" <<'EOF'
import os, sys
home = sys.argv[1]
root = os.path.join(home, "volume", "sandboxes")
uids = [os.stat(os.path.join(root, d, "pgdata")).st_uid for d in os.listdir(root)]
pairs = set(uids) | {u + 1 for u in uids}
print(f"sandboxes {len(uids)}, distinct server uids {len(set(uids))}, uids held with exec {len(pairs)}, "
      f"range {min(uids)}-{max(uids) + 1}")
EOF
echo "leases on the host: $(ls /var/lib/airlock-identities | wc -l) (were $leases_before before)"
airlock ls --json | python3 -c "import json,sys,collections; print('states', dict(collections.Counter(s['state'] for s in json.load(sys.stdin))))"
} | tee "$out/containment.txt"
