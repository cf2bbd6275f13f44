"""`scratch_db`: a sandbox for the length of a `with` block."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Mapping, Optional

from .client import AirlockError, Client, Sandbox, Ttl


@contextmanager
def scratch_db(
    golden: str,
    ttl: Ttl = "15m",
    labels: Optional[Mapping[str, str]] = None,
    client: Optional[Client] = None,
    mode: str = "owner",
    mcp: bool = False,
) -> Iterator[Sandbox]:
    """Forks a sandbox from `golden`, yields it, and deletes it when the block
    ends, however it ends. Should this process die first, the TTL deletes it."""
    client = client or Client()
    sandbox = client.fork(golden, ttl=ttl, labels=labels, mode=mode, mcp=mcp)
    try:
        yield sandbox
    finally:
        try:
            client.delete(sandbox)
        except AirlockError as e:
            if e.code != "sandbox_not_found":  # already gone is fine
                raise
