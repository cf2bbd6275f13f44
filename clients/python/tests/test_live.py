"""The per-request pattern on a live database, from Python: a grant, code with
files in an executor attached to it, the files back, and the grant gone."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from airlock_client import AirlockError, live_grant

from conftest import free_port

PROD = """
CREATE SCHEMA analytics;
CREATE TABLE analytics.accounts (id int PRIMARY KEY, tenant_id int NOT NULL, name text);
INSERT INTO analytics.accounts SELECT g, CASE WHEN g % 2 = 0 THEN 42 ELSE 7 END, 'acct ' || g FROM generate_series(1, 10) g;
CREATE TABLE analytics.salaries (name text, amount int);
CREATE ROLE ops LOGIN PASSWORD 'ops-pw-3f1' CREATEROLE;
GRANT CREATE ON DATABASE prod TO ops;
GRANT USAGE ON SCHEMA analytics TO ops WITH GRANT OPTION;
GRANT SELECT ON ALL TABLES IN SCHEMA analytics TO ops WITH GRANT OPTION;
"""

JOB = """
import os, pandas as pd, psycopg2
with psycopg2.connect(os.environ["DATABASE_URL"]) as conn:
    df = pd.read_sql("SELECT id, tenant_id, name FROM accounts ORDER BY id", conn)
df.to_csv("out.csv", index=False)
print(len(df), "rows")
"""


@pytest.fixture(scope="module")
def production():
    """A PostgreSQL of the test's own on loopback, with password logins."""
    bin_dir = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(p.split("/")[-2]))[-1]
    base = Path(tempfile.mkdtemp(prefix="al-prod-"))
    as_user = ["runuser", "-u", "nobody", "--"] if os.geteuid() == 0 else []
    if os.geteuid() == 0:
        os.chown(base, 65534, 65534)
    port = free_port()
    data = base / "data"
    run = lambda *a: subprocess.run([*as_user, *a], check=True, capture_output=True, text=True)
    run(f"{bin_dir}/initdb", "-D", str(data), "-U", "postgres", "--auth=trust")
    (data / "pg_hba.conf").write_text("local all all trust\nhost all all 127.0.0.1/32 scram-sha-256\n")
    opts = f"-c listen_addresses=127.0.0.1 -p {port} -c unix_socket_directories={base}"
    run(f"{bin_dir}/pg_ctl", "-D", str(data), "-o", opts, "-l", str(base / "log"), "-w", "start")
    psql = lambda db, sql: run(f"{bin_dir}/psql", "-h", str(base), "-p", str(port), "-U", "postgres", "-d", db, "-v", "ON_ERROR_STOP=1", "-qc", sql)
    psql("postgres", "CREATE DATABASE prod")
    psql("prod", PROD)
    yield port
    subprocess.run([*as_user, f"{bin_dir}/pg_ctl", "-D", str(data), "-m", "immediate", "stop"], capture_output=True)
    shutil.rmtree(base, ignore_errors=True)


def test_a_grant_and_its_executor_in_a_few_lines(client, production):
    dsn = f"postgresql://ops:ops-pw-3f1@127.0.0.1:{production}/prod?sslmode=disable"
    client._call("POST", "/v1/targets", {"name": "pyprod", "dsn": dsn})

    with live_grant("pyprod", ["analytics.accounts"], where="tenant_id = 42", client=client) as grant:
        assert grant.dsn and "ops" not in grant.dsn and str(production) not in grant.dsn
        assert "ops-pw" not in repr(grant)
        result = grant.run(["python3", "job.py"], files={"job.py": JOB}, get=["out.csv", "nope.csv"], timeout="60s")
    assert result.ok, result.stderr
    assert result.stdout.strip() == "5 rows"
    lines = result.files["out.csv"].decode().splitlines()
    assert lines[0] == "id,tenant_id,name" and all(",42," in line for line in lines[1:]), lines
    assert "nope.csv" in result.missing
    # The grant ended with its executor, and the block's end found it gone.
    with pytest.raises(AirlockError) as ended:
        client.revoke(grant)
    assert ended.value.code == "grant_not_found"

    # A block that raises still revokes its grant; a mistake in the code comes back as stderr.
    with pytest.raises(RuntimeError):
        with live_grant("pyprod", ["analytics.accounts"], client=client) as g:
            failed = g.run("python3 -c 'import nosuchmodule'")
            assert not failed.ok and "ModuleNotFoundError" in failed.stderr
            raise RuntimeError("the harness failed")
    assert all(x["id"] != g.id for x in client._call("GET", "/v1/grants"))
    client._call("DELETE", "/v1/targets/pyprod")


def test_mcp_on_a_live_target_reads_only_the_grant_and_runs_python_on_the_last_result(daemon, client, production):
    import asyncio

    from mcp import ClientSession, StdioServerParameters, stdio_client

    from conftest import BIN, assert_no_secrets

    dsn = f"postgresql://ops:ops-pw-3f1@127.0.0.1:{production}/prod?sslmode=disable"
    client._call("POST", "/v1/targets", {"name": "mcpprod", "dsn": dsn})
    args = ["mcp", "--target", "mcpprod", "--tables", "analytics.accounts", "--where", "tenant_id = 42"]
    params = StdioServerParameters(command=BIN, args=args, env=daemon.env)
    text = lambda r: "\n".join(c.text for c in r.content if c.type == "text")

    async def go():
        async with stdio_client(params) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                tools = sorted(t.name for t in (await session.list_tools()).tools)
                assert tools == ["describe_schema", "run_python", "run_sql"]
                r = await session.call_tool("describe_schema", {})
                assert "accounts" in text(r) and "salaries" not in text(r) and "<untrusted-data-" in text(r), text(r)
                r = await session.call_tool("run_sql", {"sql": "SELECT * FROM analytics.salaries"})
                assert r.is_error and "permission denied" in text(r)
                r = await session.call_tool("run_sql", {"sql": "SET default_transaction_read_only = off; DELETE FROM accounts"})
                assert r.is_error and "cannot delete from view" in text(r), text(r)
                r = await session.call_tool("run_sql", {"sql": "SELECT id, tenant_id, name FROM accounts ORDER BY id"})
                assert not r.is_error and '"row_count":5' in text(r) and "<untrusted-data-" in text(r), text(r)
                assert_no_secrets(text(r), "ops-pw-3f1", str(production))
                code = (
                    "import pandas as pd\n"
                    "df = pd.read_csv('result.csv')\n"
                    "print(sorted(set(df.tenant_id)), len(df))\n"
                    "df.plot.bar(x='name', y='id').get_figure().savefig('chart.png')\n"
                )
                r = await session.call_tool("run_python", {"code": code})
                assert not r.is_error and "[42] 5" in text(r), text(r)
                assert any(c.type == "image" and c.mime_type == "image/png" for c in r.content)
                r = await session.call_tool("run_python", {"code": "raise SystemExit('no')", "x": 1})
                assert r.is_error
                grants = client._call("GET", "/v1/grants")
                assert len(grants) == 1, grants  # the session's; run_python's ended with it

    asyncio.run(go())
    # The session's grant is revoked at its end.
    deadline = __import__("time").time() + 10
    while client._call("GET", "/v1/grants") and __import__("time").time() < deadline:
        __import__("time").sleep(0.1)
    assert client._call("GET", "/v1/grants") == []
    client._call("DELETE", "/v1/targets/mcpprod")
