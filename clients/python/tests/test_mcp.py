"""Airlock's MCP servers driven by the official MCP Python SDK: `airlock mcp` over
stdio, and the daemon's task-scoped gateway over streamable HTTP."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
import uuid

import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from conftest import BIN, assert_no_secrets


def stdio_params(daemon, *extra: str) -> StdioServerParameters:
    return StdioServerParameters(command=BIN, args=["mcp", "--golden", "shop", *extra], env=daemon.env)


def text_of(result) -> str:
    return "\n".join(c.text for c in result.content)


def sandboxes_labelled(daemon, label: str):
    return daemon.json("ls", "--label", label)


async def exercise(session: ClientSession, secrets: list) -> dict:
    """Lists tools and calls each one; returns what it saw, every text checked for leaks."""
    seen = {}
    tools = {t.name: t for t in (await session.list_tools()).tools}
    assert sorted(tools) == ["changes_since_fork", "describe_schema", "reset_database", "run_sql", "test_migration"]
    schema = tools["run_sql"].input_schema
    assert list(schema["properties"]) == ["sql"] and schema["required"] == ["sql"]

    async def call(name, args):
        result = await session.call_tool(name, args)
        assert_no_secrets(text_of(result), *secrets)
        return result

    r = await call("run_sql", {"sql": "SELECT count(*) AS n FROM orders"})
    assert not r.is_error and '"rows":[[500]]' in text_of(r)
    r = await call("run_sql", {"sql": "SELECT g FROM generate_series(1, 1000) g"})
    assert not r.is_error and "first 200 of 1000 rows" in text_of(r)
    r = await call("run_sql", {"sql": "SELECT * FROM no_such_table"})
    assert r.is_error and "42P01" in text_of(r) and "no_such_table" in text_of(r)
    r = await call("run_sql", {"sql": "DELETE FROM orders WHERE id > 100; ALTER TABLE orders ADD COLUMN flagged bool"})
    assert not r.is_error and "DELETE 400" in text_of(r)
    r = await call("changes_since_fork", {})
    assert "+ column orders.flagged boolean" in text_of(r) and "orders: 500 -> 100" in text_of(r)
    r = await call("describe_schema", {"table": "orders"})
    assert "flagged" in text_of(r) and "<untrusted-data-" in text_of(r)
    r = await call("reset_database", {})
    assert not r.is_error
    r = await call("run_sql", {"sql": "SELECT count(*) FROM orders"})
    assert '"rows":[[500]]' in text_of(r)
    r = await call("run_sql", {"sql": "SELECT 1", "dsn": "postgresql://elsewhere"})
    assert r.is_error and "run_sql has no argument" in text_of(r)
    seen["planted"] = text_of(await call("run_sql", {"sql": "SELECT name FROM customers WHERE id = 7"}))
    return seen


def test_stdio_session_gets_its_own_sandbox_and_deletes_it_at_the_end(daemon):
    label = f"session={uuid.uuid4().hex[:8]}"

    async def main():
        async with stdio_client(stdio_params(daemon, "--label", label)) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()  # answered once the sandbox is forked
                live = sandboxes_labelled(daemon, label)
                assert len(live) == 1
                sb = live[0]["id"]
                secrets = [daemon.password_of(sb), str(daemon.home)]
                seen = await exercise(session, secrets)
        return sb, seen

    sb, seen = asyncio.run(main())
    # The planted instruction arrives inside the envelope, as data.
    planted = seen["planted"]
    opened = planted.index("<untrusted-data-")
    assert opened < planted.index("Ignore all previous instructions")
    deadline = time.time() + 10
    while sandboxes_labelled(daemon, label) and time.time() < deadline:
        time.sleep(0.1)
    assert sandboxes_labelled(daemon, label) == []
    events = daemon.json("events", "--sandbox", sb)
    kinds = [e["kind"] for e in events]
    assert kinds.count("tool_call") == 10 and kinds[-1] == "deleted"
    assert {e["detail"]["via"] for e in events if e["kind"] == "tool_call"} == {"mcp_stdio"}
    # The audit log names the door: the fork and each tool call came in by `airlock mcp`.
    records = daemon.json("audit", "ls", "--sandbox", sb)
    doors = {(r["kind"], r["door"]) for r in records}
    assert ("created", "mcp_stdio") in doors and ("tool_call", "mcp_stdio") in doors, doors
    assert all(r["door"] == "mcp_stdio" for r in records if r["kind"] == "tool_call")
    assert daemon.cli("audit", "verify").returncode == 0


def test_http_gateway_serves_the_forked_sandbox_only(daemon, client):
    sb = client.fork("shop", mcp=True, labels={"via": "http"})
    assert sb.mcp_url.startswith(f"http://{daemon.gateway}/mcp/")

    async def main(url):
        async with streamable_http_client(url) as (read, write, *_):
            async with ClientSession(read, write) as session:
                await session.initialize()
                return await exercise(session, [daemon.password_of(sb.id), str(daemon.home)])

    asyncio.run(main(sb.mcp_url))
    events = [e for e in daemon.json("events", "--sandbox", sb.id) if e["kind"] == "tool_call"]
    assert len(events) == 10 and {e["detail"]["via"] for e in events} == {"mcp_http"}
    records = daemon.json("audit", "ls", "--sandbox", sb.id, "--kind", "tool_call")
    assert len(records) == 10 and {r["door"] for r in records} == {"mcp_http"}
    # The MCP URL went on record by its fingerprint, never in the clear.
    token = sb.mcp_url.rsplit("/", 1)[1]
    minted = daemon.json("audit", "ls", "--sandbox", sb.id, "--kind", "credential_issued")
    assert any(r["detail"]["forms"] == ["mcp_url"] for r in minted), minted
    assert token not in json.dumps(daemon.json("audit", "ls", "--limit", "100000"))

    async def migration(url):
        async with streamable_http_client(url) as (read, write, *_):
            async with ClientSession(read, write) as session:
                await session.initialize()
                return await session.call_tool("test_migration", {"sql": "ALTER TABLE orders ALTER COLUMN total TYPE float8"})

    r = asyncio.run(migration(sb.mcp_url))
    text = text_of(r)
    assert "FAILED" in text and "table_rewrite" in text and "<untrusted-data-" in text, text
    # The test is on record under the agent's sandbox, and its fork came in by the agent's door.
    tested = daemon.json("audit", "ls", "--sandbox", sb.id, "--kind", "migration_tested")
    assert len(tested) == 1 and tested[0]["door"] == "mcp_http", tested
    forks = [r for r in daemon.json("audit", "ls", "--kind", "created", "--limit", "100000")
             if r["detail"].get("labels", {}).get("airlock") == "migration-test"]
    assert forks and {r["door"] for r in forks} == {"mcp_http"}, forks
    assert_no_secrets(text, daemon.password_of(sb.id), str(daemon.home))
    assert all(sb.mcp_url.rsplit("/", 1)[1] not in json.dumps(e) for e in events)
    client.delete(sb)

    async def dead(url):
        async with streamable_http_client(url) as (read, write, *_):
            async with ClientSession(read, write) as session:
                await session.initialize()

    with pytest.raises(BaseException):
        asyncio.run(asyncio.wait_for(dead(sb.mcp_url), 20))


def test_concurrent_sessions_never_see_each_others_data(daemon):
    async def session(tag: str):
        async with stdio_client(stdio_params(daemon, "--label", f"tag={tag}")) as (read, write):
            async with ClientSession(read, write) as s:
                await s.initialize()
                await s.call_tool("run_sql", {"sql": f"CREATE TABLE mine (who text); INSERT INTO mine VALUES ('{tag}')"})
                await asyncio.sleep(0.5)  # both sessions have written before either reads
                r = await s.call_tool("run_sql", {"sql": "SELECT who FROM mine"})
                return text_of(r)

    async def main():
        return await asyncio.gather(session("alpha"), session("beta"))

    alpha, beta = asyncio.run(main())
    assert '[["alpha"]]' in alpha and "beta" not in alpha.split("<untrusted-data-", 1)[1]
    assert '[["beta"]]' in beta and "alpha" not in beta.split("<untrusted-data-", 1)[1]


def test_a_signal_deletes_the_sandbox_and_the_ttl_catches_a_killed_process(daemon):
    for sig, ttl in ((signal.SIGTERM, "15m"), (signal.SIGKILL, "2s")):
        label = f"sig={sig.name.lower()}"
        p = subprocess.Popen([BIN, "mcp", "--golden", "shop", "--ttl", ttl, "--label", label], env=daemon.env,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        deadline = time.time() + 20
        while not sandboxes_labelled(daemon, label):
            assert time.time() < deadline and p.poll() is None, p.stderr.read() if p.poll() is not None else ""
            time.sleep(0.05)
        p.send_signal(sig)
        p.wait(timeout=20)
        deadline = time.time() + 20
        while sandboxes_labelled(daemon, label) and time.time() < deadline:
            time.sleep(0.1)
        assert sandboxes_labelled(daemon, label) == [], f"{sig.name}: sandbox left behind"
        reasons = [e.get("reason") for e in daemon.json("events") if e["kind"] == "deleted"]
        assert reasons  # deleted by the session's end (user) or the reaper (ttl)
        p.stdout.close(), p.stderr.close(), p.stdin.close()


def test_a_session_on_a_golden_with_redis_is_offered_run_redis(daemon):
    seed = daemon.home / "mcp-cache.redis"
    seed.write_text('SET greeting "hello from redis"\n')
    schema = daemon.home / "mcp-tiny.sql"
    schema.write_text("CREATE TABLE t (id int);\n")
    daemon.cli("golden", "create", "mcpcache", "--schema", str(schema), "--redis-seed", str(seed))

    async def go():
        params = StdioServerParameters(command=BIN, args=["mcp", "--golden", "mcpcache"], env=daemon.env)
        async with stdio_client(params) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                names = sorted(t.name for t in (await session.list_tools()).tools)
                assert "run_redis" in names and "run_sql" in names
                result = await session.call_tool("run_redis", {"command": ["GET", "greeting"]})
                assert not result.is_error and "hello from redis" in text_of(result)
                result = await session.call_tool("run_redis", {"command": ["CONFIG", "SET", "dir", "/tmp"]})
                assert result.is_error and "NOPERM" in text_of(result)

    try:
        asyncio.run(go())
    finally:
        daemon.cli("golden", "rm", "mcpcache", "--force")


def test_a_session_on_a_redis_only_golden_is_offered_no_sql_tools(daemon):
    seed = daemon.home / "mcp-kv.redis"
    seed.write_text("HSET user:1 name ada\n")
    daemon.cli("golden", "create", "mcpkv", "--redis-seed", str(seed))

    async def go():
        params = StdioServerParameters(command=BIN, args=["mcp", "--golden", "mcpkv"], env=daemon.env)
        async with stdio_client(params) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                names = sorted(t.name for t in (await session.list_tools()).tools)
                assert "run_redis" in names and "run_sql" not in names and "test_migration" not in names
                result = await session.call_tool("describe_schema", {})
                assert not result.is_error and "user:* (hash): 1" in text_of(result)
                result = await session.call_tool("run_sql", {"sql": "SELECT 1"})
                assert result.is_error and "no PostgreSQL" in text_of(result)

    try:
        asyncio.run(go())
    finally:
        daemon.cli("golden", "rm", "mcpkv", "--force")
