# Shared by the benchmark scripts (sourced, not run): the CLI, JSON fields, and a
# fresh data root on its own XFS volume that is removed again on exit. A script
# sets AIRLOCK_HOME and GOLDENS (the goldens it builds) before sourcing this.
# AIRLOCK_BIN runs another build of Airlock (default: this tree's release build).

airlock() { "${AIRLOCK_BIN:-./target/release/airlock}" "$@"; }
json() { python3 -c "import json,sys; print(json.load(sys.stdin)$1)"; }
pgbin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
out=bench/results
mkdir -p "$out"

bench_cleanup() {
  for g in $GOLDENS; do airlock golden rm "$g" --force >/dev/null 2>&1 || true; done
  # (An older binary has no --with-router: its router lives in the daemon.)
  airlock daemon stop --with-router >/dev/null 2>&1 || airlock daemon stop >/dev/null 2>&1 || true
  if mountpoint -q "$AIRLOCK_HOME/volume" 2>/dev/null; then umount -l "$AIRLOCK_HOME/volume"; fi
  rm -rf "$AIRLOCK_HOME"
}

# Starts from nothing (as root, on a new 40G XFS image) and cleans up on exit.
bench_fresh_root() {
  trap bench_cleanup EXIT
  bench_cleanup
  if [ "$(id -u)" -eq 0 ]; then airlock storage init --size 40G >/dev/null; fi
}

# Proportional set size, in KiB, of every sandbox server and its backends.
sandbox_pss_kb() {
  local total=0 kb
  for pid in $(pgrep -f "postgres -D $AIRLOCK_HOME/volume/sandboxes/" || true); do
    for p in $pid $(pgrep -P "$pid"); do
      kb=$(awk '/^Pss:/ {print $2}' "/proc/$p/smaps_rollup" 2>/dev/null || echo 0)
      total=$((total + kb))
    done
  done
  echo "$total"
}

# A source PostgreSQL for imports, in $src (set by the script), run as the
# airlock user on a private socket, with an empty database `source`; and its
# clean-up, for the script's own cleanup.
bench_source_stop() {
  [ -d "$src/data" ] && runuser -u airlock -- "$pgbin/pg_ctl" -D "$src/data" -m immediate stop >/dev/null 2>&1 || true
  rm -rf "$src"
}
bench_source_start() {
  mkdir -p "$src" && chown airlock "$src"
  runuser -u airlock -- "$pgbin/initdb" -D "$src/data" -U postgres --auth=trust >/dev/null
  runuser -u airlock -- "$pgbin/pg_ctl" -D "$src/data" -l "$src/log" -w start \
    -o "-k $src -c listen_addresses= -c port=5432 -c max_wal_size=4GB" >/dev/null
  "$pgbin/psql" -XqAt -h "$src" -U postgres -c "CREATE DATABASE source" postgres
}
