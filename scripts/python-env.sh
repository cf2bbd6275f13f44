#!/usr/bin/env bash
# Prints the path of the Python virtual environment the client tests and the tool
# benchmark use (target/python), creating it first with pytest, the MCP SDK and
# the airlock-client package when it is missing. Extra arguments are more
# packages to install into it.
set -euo pipefail
cd "$(dirname "$0")/.."

venv=target/python
if [ ! -x "$venv/bin/pytest" ] || ! "$venv/bin/python" -c 'import mcp, airlock_client, psycopg, asyncpg, redis, async_timeout, django, jsonschema, PIL' 2>/dev/null; then
  echo "setting up $venv (pytest, mcp, psycopg, asyncpg, redis, async-timeout, django, jsonschema, pillow, airlock-client)" >&2
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check -e "clients/python[test]" >&2
fi
if [ $# -gt 0 ]; then
  "$venv/bin/pip" install --quiet --disable-pip-version-check "$@" >&2
fi
echo "$venv"
