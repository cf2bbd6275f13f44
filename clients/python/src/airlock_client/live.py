"""Live databases behind two walls: a short-lived, read-only grant on a live
target, and code run in a disposable executor whose only reachable address is
that grant. The per-request pattern::

    from airlock_client import live_grant

    with live_grant("prod", ["analytics.accounts"], where="tenant_id = 42", ttl="2m") as grant:
        result = grant.run(["python3", "job.py"], files={"job.py": code}, get=["chart.png"])
    png = result.files["chart.png"]

The grant ends when its executor does, and in any case when the block ends."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Optional, Sequence

from .client import Client
from .durations import Ttl
from .errors import AirlockError
from .grants import Grant


@contextmanager
def live_grant(
    target: str,
    tables: Sequence[str],
    where: Optional[str] = None,
    ttl: Ttl = "2m",
    statement_timeout: Ttl = None,
    client: Optional[Client] = None,
    schema: Optional[str] = None,
) -> Iterator[Grant]:
    """A grant for the length of a `with` block: minted at its start, revoked at
    its end however it ends (or when its executor ends, whichever is first).
    Should this process die first, the grant's TTL ends it, on the target's own
    server too."""
    client = client or Client()
    g = client.grant(target, tables, where=where, schema=schema, ttl=ttl, statement_timeout=statement_timeout)
    try:
        yield g
    finally:
        try:
            client.revoke(g)
        except AirlockError as e:
            if e.code != "grant_not_found":  # ended with its executor: fine
                raise
