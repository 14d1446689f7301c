"""The Docker engine's moments as aware datetimes: what billing charges by.

No Docker import: the internal API reads the times the spawner reports with it.
"""

from __future__ import annotations

import re
from datetime import datetime

RFC3339 = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)$")


def engine_time(text: str) -> datetime | None:
    """Docker's RFC 3339 times, which carry nanoseconds; 0001-01-01 means 'never'. ValueError if malformed."""
    if not text or text.startswith("0001-"):
        return None
    found = RFC3339.match(text)
    if found is None:
        raise ValueError(f"not an RFC 3339 time: {text[:40]!r}")
    head, fraction, zone = found.groups()
    offset = "+00:00" if zone == "Z" else zone
    return datetime.fromisoformat(f"{head}.{(fraction or '0')[:6]:0<6}{offset}")
