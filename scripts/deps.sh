#!/usr/bin/env bash
# Installs what Airlock needs and the machine lacks, through the system package
# manager: the PostgreSQL server and client tools, xfsprogs for copy-on-write
# storage, and Python 3 with venv for the Python client's tests. Safe to run
# again; it installs nothing that is already there.
set -euo pipefail

need=()
ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || need+=(postgresql)
command -v psql >/dev/null 2>&1 && command -v pg_dump >/dev/null 2>&1 || need+=(postgresql-client)
command -v mkfs.xfs >/dev/null 2>&1 || [ -x /usr/sbin/mkfs.xfs ] || [ -x /sbin/mkfs.xfs ] || need+=(xfsprogs)
command -v mount >/dev/null 2>&1 || need+=(mount)
# The Python client's and the MCP tests run in a virtual environment.
command -v python3 >/dev/null 2>&1 || need+=(python3)
python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || need+=(python3-venv)

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
fi

if ! command -v cargo >/dev/null 2>&1; then
  echo "Airlock is built with Rust (cargo 1.80 or newer); install it with rustup, then run this again." >&2
  exit 1
fi
