#!/usr/bin/env bash
# Runs the Python client's tests (clients/python/tests): the client against a real
# daemon, and `airlock mcp` and the MCP gateway driven by the official MCP SDK.
set -euo pipefail
cd "$(dirname "$0")/.."

venv=$(scripts/python-env.sh)
[ -x target/debug/airlock ] || cargo build --locked
exec "$venv/bin/pytest" -q clients/python/tests "$@"
