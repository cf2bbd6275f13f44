"""The REST client: fork, delete, extend, reset and run tools, over the daemon's
unix socket or over TCP with a bearer token. Standard library only."""

from __future__ import annotations

import http.client
import json
import os
import socket
from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Optional, Union
from urllib.parse import quote, urlparse

from .durations import Ttl, ttl_seconds
from .errors import AirlockError
from .grants import ExecResult, Grant, exec_body, grant_body

@dataclass
class Sandbox:
    """A forked sandbox. `dsn`, `redis_url` and `mcp_url` are secrets: keep them in the harness.

    `redis_url` (through the router) and `redis_socket_url` (its private socket)
    are set when the golden has a Redis part; `dsn` is None when it has only that.
    `router_socket_dsn` is set when the router also listens on a unix socket
    (`airlock serve --router-socket DIR`), for clients on the daemon's host."""

    id: str
    golden: str
    expires_at: str
    state: str
    dsn: Optional[str] = field(default=None, repr=False)
    socket_dsn: Optional[str] = field(default=None, repr=False)
    router_socket_dsn: Optional[str] = field(default=None, repr=False)
    mcp_url: Optional[str] = field(default=None, repr=False)
    redis_url: Optional[str] = field(default=None, repr=False)
    redis_socket_url: Optional[str] = field(default=None, repr=False)
    labels: Dict[str, str] = field(default_factory=dict)
    name: Optional[str] = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Sandbox":
        return cls(
            id=data["id"],
            golden=data["golden"],
            expires_at=data["expires_at"],
            state=data["state"],
            dsn=data.get("dsn"),
            socket_dsn=data.get("socket_dsn"),
            router_socket_dsn=data.get("router_socket_dsn"),
            mcp_url=data.get("mcp_url"),
            redis_url=data.get("redis_url"),
            redis_socket_url=data.get("redis_socket_url"),
            labels=dict(data.get("labels") or {}),
            name=data.get("name"),
        )


def _default_home() -> str:
    if os.environ.get("AIRLOCK_HOME"):
        return os.environ["AIRLOCK_HOME"]
    if os.geteuid() == 0:
        return "/var/lib/airlock"
    return os.path.join(os.path.expanduser("~"), ".local", "share", "airlock")


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self._path)


class Client:
    """A client of one Airlock daemon.

    With no arguments it uses ``AIRLOCK_URL`` and ``AIRLOCK_TOKEN`` when set, else
    the local daemon's socket under ``AIRLOCK_HOME`` (or the default data root).
    """

    def __init__(
        self,
        socket_path: Optional[str] = None,
        url: Optional[str] = None,
        token: Optional[str] = None,
        timeout: float = 120.0,
    ):
        url = url or (None if socket_path else os.environ.get("AIRLOCK_URL"))
        self._timeout = timeout
        if url:
            parsed = urlparse(url if "://" in url else f"http://{url}")
            if parsed.scheme not in ("http", "https"):
                raise AirlockError("invalid_request", f"unsupported URL {url!r}", "give http://HOST:PORT")
            self._remote = parsed
            self._token = token or os.environ.get("AIRLOCK_TOKEN")
            if not self._token:
                raise AirlockError("unauthorized", "a daemon URL needs a bearer token", "pass token= or set AIRLOCK_TOKEN")
            self._socket = None
        else:
            self._remote = None
            self._token = None
            self._socket = socket_path or os.path.join(_default_home(), "airlock.sock")

    def __repr__(self) -> str:  # never shows the token
        where = self._socket or f"{self._remote.scheme}://{self._remote.netloc}"
        return f"Client({where!r})"

    # -- sandboxes -----------------------------------------------------------------

    def fork(
        self,
        golden: str,
        ttl: Ttl = None,
        labels: Optional[Mapping[str, str]] = None,
        name: Optional[str] = None,
        mode: str = "owner",
        mcp: bool = False,
        wait: Ttl = None,
    ) -> Sandbox:
        """Forks a sandbox from `golden`. `mcp=True` also mints a task-scoped MCP URL."""
        body: Dict[str, Any] = {"golden": golden, "labels": dict(labels or {}), "mcp": mcp, "access": {"mode": mode}}
        if ttl is not None:
            body["ttl_seconds"] = ttl_seconds(ttl)
        if name is not None:
            body["name"] = name
        if wait is not None:
            body["wait_seconds"] = ttl_seconds(wait)
        return Sandbox.from_json(self._call("POST", "/v1/sandboxes", body))

    def get(self, sandbox: Union[str, Sandbox]) -> Sandbox:
        """The sandbox as it is now."""
        return Sandbox.from_json(self._call("GET", f"/v1/sandboxes/{_id(sandbox)}"))

    def delete(self, sandbox: Union[str, Sandbox]) -> None:
        """Deletes a sandbox, its data and its credential."""
        self._call("DELETE", f"/v1/sandboxes/{_id(sandbox)}")

    def extend(self, sandbox: Union[str, Sandbox], ttl: Ttl) -> Sandbox:
        """Makes the sandbox expire `ttl` from now."""
        body = {"ttl_seconds": ttl_seconds(ttl)}
        return Sandbox.from_json(self._call("POST", f"/v1/sandboxes/{_id(sandbox)}/extend", body))

    def reset(self, sandbox: Union[str, Sandbox]) -> Sandbox:
        """Puts the sandbox back to its golden's state, same id and credential."""
        return Sandbox.from_json(self._call("POST", f"/v1/sandboxes/{_id(sandbox)}/reset"))

    # -- tools ---------------------------------------------------------------------

    def sql(self, sandbox: Union[str, Sandbox], sql: str) -> Dict[str, Any]:
        """Runs SQL as the agent would; returns the structured result (capped rows,
        tags, and `error` with SQLSTATE when PostgreSQL refused)."""
        return self._call("POST", f"/v1/sandboxes/{_id(sandbox)}/sql", {"sql": sql})

    def call_tool(self, sandbox: Union[str, Sandbox], tool: str, arguments: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
        """Runs one of the agent tools; returns ``{"is_error", "result", "text"}``,
        where `text` is what a model should see."""
        return self._call("POST", f"/v1/sandboxes/{_id(sandbox)}/tools/{quote(tool, safe='')}", dict(arguments or {}))

    def tools(self) -> list:
        """The agent tools' names, descriptions and input schemas."""
        return self._call("GET", "/v1/tools")

    # -- live targets --------------------------------------------------------------

    def grant(self, target: str, tables, where=None, schema=None, ttl: Ttl = None, statement_timeout: Ttl = None, connections=None) -> Grant:
        """Mints a short-lived, read-only grant on live target `target`: SELECT on
        exactly `tables` (and, with `where`, only those rows), reached through the
        router. Returns a `Grant` whose `dsn` is given this once."""
        body = grant_body(tables, where, schema, ttl, statement_timeout, connections)
        return Grant.from_json(self._call("POST", f"/v1/targets/{quote(target, safe='')}/grants", body), self)

    def revoke(self, grant) -> None:
        """Ends a grant now: its sessions are cut, its role dropped on the target."""
        gid = grant if isinstance(grant, str) else grant.id
        self._call("DELETE", f"/v1/grants/{quote(gid, safe='')}")

    def exec_grant(self, grant, argv, files=None, get=(), timeout: Ttl = "60s", stdin=None) -> ExecResult:
        """Runs a command in a disposable executor attached to `grant`; the grant
        ends with it. Returns an `ExecResult` with the files asked for."""
        gid = grant.id if isinstance(grant, Grant) else grant
        body = exec_body(argv, files, get, timeout, stdin)
        return ExecResult.from_json(self._call("POST", f"/v1/grants/{quote(gid, safe='')}/exec", body))

    # -- transport -----------------------------------------------------------------

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        payload = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} if payload is not None else {}
        if self._remote is not None:
            headers["Authorization"] = f"Bearer {self._token}"
            cls = http.client.HTTPSConnection if self._remote.scheme == "https" else http.client.HTTPConnection
            conn = cls(self._remote.hostname, self._remote.port, timeout=self._timeout)
        else:
            conn = _UnixConnection(self._socket, self._timeout)
        try:
            try:
                conn.request(method, path, body=payload, headers=headers)
                response = conn.getresponse()
                raw = response.read()
            except OSError as e:
                where = self._socket or self._remote.netloc
                raise AirlockError(
                    "daemon_unreachable",
                    f"cannot reach the Airlock daemon at {where}: {e}",
                    "start it with `airlock serve`, or check AIRLOCK_HOME / AIRLOCK_URL",
                ) from None
        finally:
            conn.close()
        try:
            data = json.loads(raw) if raw else None
        except ValueError:
            raise AirlockError("internal", f"the daemon answered {response.status} with something not JSON") from None
        if response.status >= 400:
            data = data or {}
            raise AirlockError(data.get("code", "internal"), data.get("message", f"HTTP {response.status}"), data.get("hint", ""), response.status)
        return data


def _id(sandbox: Union[str, Sandbox]) -> str:
    return quote(sandbox.id if isinstance(sandbox, Sandbox) else sandbox, safe="")
