#!/usr/bin/env bash
# Installs what Airlock needs and the machine lacks, through the system package
# manager: the PostgreSQL server, its client tools and its server headers (the
# in-server guard is built against them), xfsprogs and btrfs-progs for
# copy-on-write storage, Python 3 with venv for the Python client's tests, and
# with pandas, matplotlib and psycopg2 as the executor's default image, and
# with `test`, Java with pgjdbc and Node.js with npm for the router's driver tests,
# PostGIS for the import tests and Prometheus for the metrics tests.
# Safe to run again; it installs nothing that is already there.
set -euo pipefail

need=()
ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || need+=(postgresql)
command -v psql >/dev/null 2>&1 && command -v pg_dump >/dev/null 2>&1 || need+=(postgresql-client)
# The guard is compiled against the server headers of every installed major
# (Debian's postgresql-server-dev-N); the newest server is the one Airlock runs.
for bin in /usr/lib/postgresql/*/bin/postgres; do
  [ -x "$bin" ] || continue
  major=$(basename "$(dirname "$(dirname "$bin")")")
  [ -f "/usr/include/postgresql/$major/server/postgres.h" ] || need+=("postgresql-server-dev-$major")
done
command -v mkfs.xfs >/dev/null 2>&1 || [ -x /usr/sbin/mkfs.xfs ] || [ -x /sbin/mkfs.xfs ] || need+=(xfsprogs)
command -v mkfs.btrfs >/dev/null 2>&1 || [ -x /usr/sbin/mkfs.btrfs ] || [ -x /sbin/mkfs.btrfs ] || need+=(btrfs-progs)
command -v mount >/dev/null 2>&1 || need+=(mount)
# `airlock postgres install` fetches other majors over HTTPS, unpacks them and
# compiles the in-server guard against their headers.
command -v curl >/dev/null 2>&1 || need+=(curl)
command -v xz >/dev/null 2>&1 || need+=(xz-utils)
command -v unzip >/dev/null 2>&1 || need+=(unzip)
command -v cc >/dev/null 2>&1 || need+=(gcc libc6-dev)
# The Python client's and the MCP tests run in a virtual environment.
command -v python3 >/dev/null 2>&1 || need+=(python3)
# A golden's Redis part and every sandbox's Redis run on Debian's redis-server
# (redis-cli comes with it).
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || need+=(python3-venv)
# The executor's default image: the host's Python with pandas and matplotlib,
# which code an agent writes against a grant reaches for first.
/usr/bin/python3 -c 'import pandas' >/dev/null 2>&1 || need+=(python3-pandas)
/usr/bin/python3 -c 'import matplotlib' >/dev/null 2>&1 || need+=(python3-matplotlib)
/usr/bin/python3 -c 'import psycopg2' >/dev/null 2>&1 || need+=(python3-psycopg2)
# `deps.sh test`: also the drivers the router is tested with, pgjdbc on Java and
# node-postgres on Node.js.
if [ "${1:-}" = test ]; then
  [ -f /usr/share/java/postgresql.jar ] || need+=(libpostgresql-jdbc-java)
  # Imports are tested against a source with PostGIS (an untrusted extension).
  for bin in /usr/lib/postgresql/*/bin/postgres; do
    [ -x "$bin" ] || continue
    major=$(basename "$(dirname "$(dirname "$bin")")")
    [ -f "/usr/share/postgresql/$major/extension/postgis.control" ] || need+=("postgresql-$major-postgis-3")
  done
  # A real Prometheus scrapes the daemon in the metrics tests; promtool checks
  # the exposition and the shipped alerting rules.
  command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1 || need+=(prometheus)
  # The cluster tests run a real etcd, and nodes in network namespaces (ip).
  command -v etcd >/dev/null 2>&1 || need+=(etcd-server)
  command -v ip >/dev/null 2>&1 || need+=(iproute2)
  command -v java >/dev/null 2>&1 || need+=(default-jre-headless)
  command -v node >/dev/null 2>&1 || need+=(nodejs)
  command -v npm >/dev/null 2>&1 || need+=(npm)
fi

if [ ${#need[@]} -gt 0 ]; then
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 || { echo "need root (or sudo) to install: ${need[*]}" >&2; exit 1; }
    sudo=sudo
  fi
  echo "installing: ${need[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  # Debian's server package starts a cluster of its own; Airlock runs its own instances.
  if command -v systemctl >/dev/null 2>&1; then $sudo systemctl stop postgresql >/dev/null 2>&1 || true; fi
  # Its Redis package starts one too; Airlock starts each sandbox's own.
  if command -v systemctl >/dev/null 2>&1; then $sudo systemctl stop redis-server >/dev/null 2>&1 || true; fi
  # And its Prometheus package (tests start their own, on ports they pick).
  if command -v systemctl >/dev/null 2>&1; then $sudo systemctl stop prometheus prometheus-node-exporter >/dev/null 2>&1 || true; fi
  # And its etcd package (the cluster tests start their own).
  if command -v systemctl >/dev/null 2>&1; then $sudo systemctl stop etcd >/dev/null 2>&1 || true; fi
fi
# The HTML migration report is tested in a real browser. Chromium is installed
# on its own: where the system has no package for it (Ubuntu ships a snap),
# everything else still installs and that one test says it did not run.
if [ "${1:-}" = test ] && ! command -v chromium >/dev/null 2>&1; then
  sudo=""; [ "$(id -u)" -ne 0 ] && sudo=sudo
  echo "installing: chromium"
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends chromium >/dev/null \
    || echo "chromium could not be installed: the HTML report's browser test will say it did not run" >&2
fi
# A server installed just now brings its headers' package name only now.
for bin in /usr/lib/postgresql/*/bin/postgres; do
  [ -x "$bin" ] || continue
  major=$(basename "$(dirname "$(dirname "$bin")")")
  if [ ! -f "/usr/include/postgresql/$major/server/postgres.h" ]; then
    sudo=""; [ "$(id -u)" -ne 0 ] && sudo=sudo
    echo "installing: postgresql-server-dev-$major"
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "postgresql-server-dev-$major" >/dev/null
  fi
done

if ! command -v cargo >/dev/null 2>&1; then
  echo "Airlock is built with Rust (cargo 1.80 or newer); install it with rustup, then run this again." >&2
  exit 1
fi
