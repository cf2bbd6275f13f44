"""Client for Airlock: a throwaway copy-on-write PostgreSQL per AI-agent task.

The harness forks a sandbox per task, keeps its connection string to itself, and
hands the model a tool that takes only SQL::

    from airlock_client import Client, scratch_db, sql_tool

    client = Client()
    with scratch_db("shop", ttl="15m", client=client) as sandbox:
        tool = sql_tool(client, sandbox)
        print(tool("SELECT count(*) FROM orders"))

For a live database, a read-only grant and an executor (see `live_grant`)::

    with live_grant("prod", ["analytics.accounts"], where="tenant_id = 42") as grant:
        result = grant.run(["python3", "job.py"], files={"job.py": code}, get=["chart.png"])
"""

from .client import AirlockError, Client, Sandbox
from .grants import ExecResult, Grant
from .live import live_grant
from .scratch import scratch_db
from .tool import SqlTool, sql_tool

__all__ = ["AirlockError", "Client", "ExecResult", "Grant", "Sandbox", "SqlTool", "live_grant", "scratch_db", "sql_tool"]
