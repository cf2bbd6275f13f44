#!/usr/bin/env bash
# Runs the Python client's tests (clients/python/tests): the client against a real
# daemon, and `airlock mcp` and the MCP gateway driven by the official MCP SDK.
# Installs them into a virtual environment under target/ the first time.
set -euo pipefail
cd "$(dirname "$0")/.."

venv=target/python
if [ ! -x "$venv/bin/pytest" ] || ! "$venv/bin/python" -c 'import mcp, airlock_client' 2>/dev/null; then
  echo "setting up $venv (pytest, mcp, airlock-client)"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check -e "clients/python[test]"
fi
[ -x target/debug/airlock ] || cargo build --locked
exec "$venv/bin/pytest" -q clients/python/tests "$@"
