"""A ready `run_sql` tool for agent SDKs: the definition the model sees, with a
single `sql` property, and the callable the harness runs it with. The model never
sees or chooses the database; the callable is bound to one sandbox."""

from __future__ import annotations

from typing import Any, Dict, Union

from .client import Client, Sandbox


class SqlTool:
    """`run_sql` bound to one sandbox. Call it with SQL to get the text for the
    model (database content inside an untrusted-data envelope)."""

    name = "run_sql"

    def __init__(self, client: Client, sandbox: Union[str, Sandbox], spec: Dict[str, Any]):
        self._client = client
        self._sandbox = sandbox
        self.description: str = spec["description"]
        self.input_schema: Dict[str, Any] = spec["input_schema"]

    def __repr__(self) -> str:
        sid = self._sandbox.id if isinstance(self._sandbox, Sandbox) else self._sandbox
        return f"SqlTool(sandbox={sid!r})"

    def __call__(self, sql: str) -> str:
        """Runs `sql`; returns the text a model should read, errors included."""
        return self.call({"sql": sql})["text"]

    def call(self, arguments: Dict[str, Any]) -> Dict[str, Any]:
        """Runs the tool with the model's arguments as given; returns
        ``{"is_error", "result", "text"}``. Arguments the tool does not take (an
        invented one, none, a wrong type) come back as a tool error whose text
        tells the model what to send, as over MCP; only Airlock's own failures
        (and a sandbox that is gone) raise :class:`AirlockError`."""
        return self._client.call_tool(self._sandbox, self.name, arguments)

    def run(self, sql: str) -> Dict[str, Any]:
        """Runs `sql`; returns the structured result (for the harness, not the model)."""
        return self._client.sql(self._sandbox, sql)

    @property
    def openai(self) -> Dict[str, Any]:
        """The definition in OpenAI's Chat Completions `tools` shape."""
        return {"type": "function", "function": {"name": self.name, "description": self.description, "parameters": self.input_schema}}

    @property
    def openai_responses(self) -> Dict[str, Any]:
        """The definition in OpenAI's Responses API `tools` shape."""
        return {"type": "function", "name": self.name, "description": self.description, "parameters": self.input_schema}

    @property
    def anthropic(self) -> Dict[str, Any]:
        """The definition in Anthropic's Messages API `tools` shape."""
        return {"name": self.name, "description": self.description, "input_schema": self.input_schema}

    @property
    def mcp(self) -> Dict[str, Any]:
        """The definition as MCP lists tools."""
        return {"name": self.name, "description": self.description, "inputSchema": self.input_schema}


def sql_tool(client: Client, sandbox: Union[str, Sandbox]) -> SqlTool:
    """A `run_sql` tool bound to `sandbox`, its definition read from the daemon."""
    spec = next(t for t in client.tools() if t["name"] == "run_sql")
    return SqlTool(client, sandbox, spec)
