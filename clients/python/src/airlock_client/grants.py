"""Grants on live targets and what an executor answers, as the client holds
them (the requests that make them are `Client.grant` and `Client.exec_grant`)."""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

from .durations import Ttl, ttl_seconds
from .errors import AirlockError


@dataclass
class ExecResult:
    """What a command did: its exit code (None when a signal or the timeout
    ended it), output, and the files brought back (`files`: path → bytes;
    `missing`: path → why it was not)."""

    exit_code: Optional[int]
    timed_out: bool
    stdout: str
    stderr: str
    duration_ms: int
    files: Dict[str, bytes] = field(default_factory=dict)
    missing: Dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "ExecResult":
        files: Dict[str, bytes] = {}
        missing: Dict[str, str] = {}
        for f in data.get("files") or []:
            if f.get("content_base64") is not None:
                files[f["path"]] = base64.b64decode(f["content_base64"])
            else:
                missing[f["path"]] = f.get("missing") or "not brought back"
        return cls(
            exit_code=data.get("exit_code"),
            timed_out=bool(data.get("timed_out")),
            stdout=data.get("stdout", ""),
            stderr=data.get("stderr", ""),
            duration_ms=int(data.get("duration_ms", 0)),
            files=files,
            missing=missing,
        )

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


@dataclass
class Grant:
    """A grant on a live target. `dsn` reaches it through Airlock's router; it is
    a secret: keep it in the harness, or let `run` hand it to the executor."""

    id: str
    target: str
    role: str
    tables: List[str]
    expires_at: str
    where: Optional[str] = None
    cannot_take_away: List[str] = field(default_factory=list)
    dsn: Optional[str] = field(default=None, repr=False)
    _client: Optional[Any] = field(default=None, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any], client: Optional[Any] = None) -> "Grant":
        return cls(
            id=data["id"],
            target=data["target"],
            role=data["role"],
            tables=list(data.get("tables") or []),
            expires_at=data["expires_at"],
            where=data.get("where"),
            cannot_take_away=list(data.get("cannot_take_away") or []),
            dsn=data.get("dsn"),
            _client=client,
        )

    def run(
        self,
        argv: Union[str, Sequence[str]],
        files: Optional[Mapping[str, Union[bytes, str]]] = None,
        get: Sequence[str] = (),
        timeout: Ttl = "60s",
        stdin: Optional[str] = None,
    ) -> ExecResult:
        """Runs `argv` (a list, or a shell command line) in an executor attached to
        this grant, with `files` (path → contents) put in its workspace and `get`
        brought back. The grant ends with it."""
        if self._client is None:
            raise AirlockError("invalid_request", "this grant has no client to run with", "mint it with Client.grant")
        return self._client.exec_grant(self, argv, files=files, get=get, timeout=timeout, stdin=stdin)


def exec_body(argv, files, get, timeout, stdin) -> Dict[str, Any]:
    """The request that runs a command with files in an executor."""
    if isinstance(argv, str):
        argv = ["sh", "-c", argv]
    body: Dict[str, Any] = {"argv": list(argv), "timeout_seconds": ttl_seconds(timeout)}
    if stdin is not None:
        body["stdin"] = stdin
    if files:
        body["files"] = [
            {"path": path, "content_base64": base64.b64encode(c.encode() if isinstance(c, str) else c).decode()}
            for path, c in files.items()
        ]
    if get:
        body["get"] = list(get)
    return body


def grant_body(tables: Sequence[str], where=None, schema=None, ttl: Ttl = None, statement_timeout: Ttl = None, connections=None) -> Dict[str, Any]:
    """The request that mints a grant (see `Client.grant`)."""
    body: Dict[str, Any] = {"tables": list(tables)}
    if where is not None:
        body["where"] = where
    if schema is not None:
        body["schema"] = schema
    if ttl is not None:
        body["ttl_seconds"] = ttl_seconds(ttl)
    if statement_timeout is not None:
        body["statement_timeout_ms"] = ttl_seconds(statement_timeout) * 1000
    if connections is not None:
        body["connections"] = connections
    return body
