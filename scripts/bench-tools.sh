#!/usr/bin/env bash
# Agent tool-call latency: `airlock mcp` session start, and run_sql over MCP stdio,
# the MCP HTTP gateway and REST, against psycopg baselines in the same run
# (scripts/bench_tools.py). Results go to bench/results/tools.txt.
set -euo pipefail
cd "$(dirname "$0")/.."

export AIRLOCK_HOME=${AIRLOCK_BENCH_HOME:-/var/lib/airlock-bench-tools}
export AIRLOCK_ROUTER=127.0.0.1:7438 AIRLOCK_GATEWAY=127.0.0.1:7439
GOLDENS=bench-40mb
source scripts/bench-lib.sh
bench_fresh_root
airlock golden create bench-40mb --schema bench/schema.sql --seed bench/seed-40mb.sql --pool 4 >/dev/null
venv=$(scripts/python-env.sh "psycopg[binary]>=3.2")
# The pool fills in the background; give it a moment before the first session.
sleep 2
{
echo "# $(date -u +%Y-%m-%dT%H:%MZ) on $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB, $(uname -r)"
echo
"$venv/bin/python" scripts/bench_tools.py bench-40mb "${ITERATIONS:-50}"
} | tee "$out/tools.txt"
