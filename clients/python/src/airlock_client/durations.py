"""TTLs and timeouts as the client takes them: seconds, or "90s", "15m", "1h30m"."""

from __future__ import annotations

import re
from typing import Optional, Union

from .errors import AirlockError

Ttl = Union[int, float, str, None]

_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}


def ttl_seconds(ttl: Ttl) -> Optional[int]:
    """Seconds from an int, a float or a duration string such as "90s", "15m" or "1h30m"."""
    if ttl is None:
        return None
    if isinstance(ttl, (int, float)):
        if ttl <= 0:
            raise AirlockError("invalid_ttl", f"a TTL of {ttl} is not positive", "give seconds > 0 or '15m'")
        return max(1, int(ttl))
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)", ttl.strip())
    if not parts or "".join(n + u for n, u in parts) != re.sub(r"\s", "", ttl):
        raise AirlockError("invalid_ttl", f"cannot read the TTL {ttl!r}", "give seconds, or a duration such as 90s, 15m or 1h30m")
    return max(1, int(sum(float(n) * _UNITS[u] for n, u in parts)))
