"""Tool-call latency through each door, with direct-connection baselines measured in
the same run. Run by scripts/bench-tools.sh against a daemon it started.

Measures, N times each, median and p99:
- session start: `airlock mcp` launched until `initialize` is answered (the fork,
  from the golden's warm pool, included), with the official MCP SDK;
- run_sql of a point query and of a 200-row query: over MCP stdio, over the MCP
  HTTP gateway, and over REST (/sql);
- baselines: psycopg connecting through the router and running the same query
  (what a harness handing out the DSN would do per call), and the same query on a
  connection already open (the floor).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import time

import psycopg
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from airlock_client import Client

GOLDEN = sys.argv[1]
N = int(sys.argv[2]) if len(sys.argv) > 2 else 50
BIN = os.path.abspath("target/release/airlock")
QUERIES = {
    "point": "SELECT name, plan FROM accounts WHERE id = 42",
    "200 rows": "SELECT id, account_id, kind, at FROM events ORDER BY id LIMIT 200",
}


def summary(name: str, samples: list) -> str:
    ms = sorted(s * 1000 for s in samples)
    p99 = ms[min(len(ms) - 1, int(round(0.99 * (len(ms) - 1))))]
    return f"{name:58} {statistics.median(ms):8.2f} {p99:8.2f} {len(ms):5}"


def timed(fn, n=N):
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


async def atimed(fn, n=N):
    out = []
    for _ in range(n):
        t = time.perf_counter()
        await fn()
        out.append(time.perf_counter() - t)
    return out


async def session_start(n: int) -> list:
    params = StdioServerParameters(command=BIN, args=["mcp", "--golden", GOLDEN, "--ttl", "5m"], env=dict(os.environ))
    out = []
    for _ in range(n):
        t = time.perf_counter()
        async with stdio_client(params) as (read, write):
            async with ClientSession(read, write) as s:
                await s.initialize()
                out.append(time.perf_counter() - t)
        await asyncio.sleep(0.05)  # let the pool refill, as between real sessions
    return out


async def mcp_calls(session: ClientSession, sql: str) -> list:
    async def call():
        r = await session.call_tool("run_sql", {"sql": sql})
        assert not r.is_error, r
    await call()
    return await atimed(call)


async def stdio_calls() -> dict:
    params = StdioServerParameters(command=BIN, args=["mcp", "--golden", GOLDEN, "--ttl", "30m"], env=dict(os.environ))
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as s:
            await s.initialize()
            return {k: await mcp_calls(s, q) for k, q in QUERIES.items()}


async def http_calls(url: str) -> dict:
    async with streamable_http_client(url) as (read, write, *_):
        async with ClientSession(read, write) as s:
            await s.initialize()
            return {k: await mcp_calls(s, q) for k, q in QUERIES.items()}


def main() -> None:
    client = Client()
    rows = ["# name" + " " * 52 + "  p50 ms  p99 ms     n"]
    rows.append(summary("MCP stdio session start (airlock mcp → initialize)", asyncio.run(session_start(max(10, N // 2)))))
    stdio = asyncio.run(stdio_calls())
    sb = client.fork(GOLDEN, ttl="30m", mcp=True)
    try:
        http = asyncio.run(http_calls(sb.mcp_url))
        for kind, sql in QUERIES.items():
            client.sql(sb, sql)
            rest = timed(lambda: client.sql(sb, sql))
            direct_dsn = sb.dsn.split("?")[0] + "?sslmode=disable"
            per_call = timed(lambda: psycopg.connect(direct_dsn, autocommit=True).execute(sql).fetchall())
            with psycopg.connect(direct_dsn, autocommit=True) as conn:
                floor = timed(lambda: conn.execute(sql).fetchall())
            rows.append(summary(f"run_sql {kind}: MCP stdio (airlock mcp)", stdio[kind]))
            rows.append(summary(f"run_sql {kind}: MCP streamable HTTP gateway", http[kind]))
            rows.append(summary(f"run_sql {kind}: REST /sql", rest))
            rows.append(summary(f"baseline {kind}: psycopg connect via router + query", per_call))
            rows.append(summary(f"baseline {kind}: psycopg query on an open connection", floor))
    finally:
        client.delete(sb)
    print("\n".join(rows))


if __name__ == "__main__":
    main()
