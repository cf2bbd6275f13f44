"""The Python client against a real daemon."""

from __future__ import annotations

import pytest

from airlock_client import AirlockError, Client, scratch_db, sql_tool
from airlock_client.client import ttl_seconds

from conftest import assert_no_secrets


def test_fork_extend_reset_and_delete(daemon, client):
    sb = client.fork("shop", ttl="10m", labels={"task": "t1"})
    assert sb.id.startswith("sb-") and sb.golden == "shop" and sb.state == "running"
    assert sb.dsn and sb.dsn.startswith("postgresql://")
    assert sb.dsn not in repr(sb) and "airlock_agent" not in repr(sb)
    assert client.sql(sb, "DELETE FROM orders")["statements"][0]["tag"] == "DELETE 500"
    before = client.get(sb).expires_at
    assert client.extend(sb, "2h").expires_at > before
    client.reset(sb)
    assert client.sql(sb.id, "SELECT count(*) FROM orders")["rows"] == [[500]]
    client.delete(sb)
    with pytest.raises(AirlockError) as e:
        client.get(sb)
    assert e.value.code == "sandbox_not_found" and e.value.status == 404 and e.value.hint


def test_errors_carry_code_message_and_hint(client):
    with pytest.raises(AirlockError) as e:
        client.fork("no-such-golden")
    assert e.value.code == "golden_not_found" and e.value.hint
    with pytest.raises(AirlockError) as e:
        client.fork("shop", ttl="soon")
    assert e.value.code == "invalid_ttl"
    with pytest.raises(AirlockError) as e:
        Client(socket_path="/nonexistent/airlock.sock").tools()
    assert e.value.code == "daemon_unreachable"


def test_ttl_strings():
    assert ttl_seconds("15m") == 900 and ttl_seconds("1h30m") == 5400 and ttl_seconds(90) == 90
    assert ttl_seconds("500ms") == 1 and ttl_seconds(None) is None
    for bad in ("", "15 minutes", "m15", -1):
        with pytest.raises(AirlockError):
            ttl_seconds(bad)


def test_scratch_db_deletes_its_sandbox_however_the_block_ends(daemon, client):
    with scratch_db("shop", ttl="5m", labels={"case": "ok"}, client=client) as sb:
        assert client.sql(sb, "SELECT count(*) FROM customers")["rows"] == [[50]]
        kept = sb.id
    assert not [s for s in daemon.json("ls") if s["id"] == kept]

    with pytest.raises(ZeroDivisionError):
        with scratch_db("shop", client=client, labels={"case": "raises"}) as sb:
            raised = sb.id
            client.sql(sb, "CREATE TABLE scratch (x int)")
            1 / 0
    assert not [s for s in daemon.json("ls") if s["id"] == raised]
    events = daemon.json("events", "--sandbox", raised)
    assert [e["reason"] for e in events if e["kind"] == "deleted"] == ["user"]

    # Deleted inside the block already: leaving it is still quiet.
    with scratch_db("shop", client=client) as sb:
        client.delete(sb)


def test_remote_client_needs_the_token(daemon):
    remote = Client(url=f"http://{daemon.tcp}", token=daemon.token)
    with scratch_db("shop", client=remote) as sb:
        assert remote.sql(sb, "SELECT 1 AS one")["rows"] == [[1]]
    assert daemon.token not in repr(remote)
    with pytest.raises(AirlockError) as e:
        Client(url=f"http://{daemon.tcp}", token="wrong").tools()
    assert e.value.code == "unauthorized" and e.value.status == 401


def test_sql_tool_offers_one_property_in_every_shape_and_returns_enveloped_text(daemon, client):
    with scratch_db("shop", client=client) as sb:
        tool = sql_tool(client, sb)
        for definition, schema in (
            (tool.openai, tool.openai["function"]["parameters"]),
            (tool.openai_responses, tool.openai_responses["parameters"]),
            (tool.anthropic, tool.anthropic["input_schema"]),
            (tool.mcp, tool.mcp["inputSchema"]),
        ):
            assert list(schema["properties"]) == ["sql"] and schema["required"] == ["sql"]
            assert "run_sql" in str(definition)
        text = tool("SELECT name FROM customers WHERE id = 7")
        assert "<untrusted-data-" in text and "Ignore all previous instructions" in text
        body = text.split("\n", 2)[2]
        assert body.index("<untrusted-data-") < body.index("Ignore all previous")
        failed = tool.call({"sql": "SELECT * FROM nope"})
        assert failed["is_error"] and "42P01" in failed["text"]
        # What a model gets wrong comes back as a tool error it can read and
        # act on, never an exception: the harness loop goes on.
        for arguments, said in (
            ({"sql": "SELECT 1", "host": "db.internal"}, 'run_sql has no argument "host"'),
            ({}, "run_sql needs `sql`"),
            ({"sql": ["SELECT 1"]}, "`sql` must be a string"),
        ):
            refused = tool.call(arguments)
            assert refused["is_error"] and said in refused["text"], refused
            assert refused["result"]["error"]["code"] == "invalid_arguments"
        # A sandbox that is gone is the harness's to handle: that raises.
        with pytest.raises(AirlockError) as e:
            sql_tool(client, "sb-doesnotexist").call({"sql": "SELECT 1"})
        assert e.value.code == "sandbox_not_found"
        assert tool.run("SELECT count(*) FROM orders")["rows"] == [[500]]
        password = daemon.password_of(sb.id)
        for out in (text, failed["text"], repr(tool)):
            assert_no_secrets(out, password, str(daemon.home))


def test_the_example_harness_runs_each_task_on_its_own_database(daemon):
    import json as _json
    import subprocess
    import sys

    from conftest import REPO

    done = subprocess.run(
        [sys.executable, str(REPO / "examples" / "harness" / "agent_harness.py"), "--golden", "shop", "--json"],
        env=daemon.env, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    results = {r["task"]: r for r in _json.loads(done.stdout)}
    assert results["refund"]["passed"] and results["cleanup"]["passed"]
    # The reckless DELETE emptied its own sandbox only; the golden and the other task were untouched.
    assert results["cleanup"]["rows_changed"] == {"orders": 0}
    assert results["refund"]["rows_changed"] == {"orders": 500}
    assert [s for s in daemon.json("ls") if s["labels"].get("task") in ("refund", "cleanup")] == []
