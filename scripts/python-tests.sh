#!/usr/bin/env bash
# Runs the Python client's tests (clients/python/tests): the client against a real
# daemon, `airlock mcp` and the MCP gateway driven by the official MCP SDK, and
# the router driven by the drivers people use (psycopg, asyncpg, pgjdbc, node-postgres),
# and the Redis front door (and exec's REDIS_URL) by redis-py, ioredis and node-redis.
set -euo pipefail
cd "$(dirname "$0")/.."

venv=$(scripts/python-env.sh)
# node-postgres, ioredis and node-redis, for the driver tests (npm's registry; kept under target/).
if [ ! -d target/node/node_modules/pg ] || [ ! -d target/node/node_modules/ioredis ] || [ ! -d target/node/node_modules/redis ]; then
  mkdir -p target/node
  [ -f target/node/package.json ] || echo '{"private": true}' > target/node/package.json
  (cd target/node && npm install --silent --no-audit --no-fund pg@8 ioredis@5 redis@4 >&2)
fi
[ -x target/debug/airlock ] || cargo build --locked
exec "$venv/bin/pytest" -q clients/python/tests "$@"
