"""Secrets the portal makes for itself once and keeps in its data directory (mode 600)."""

from __future__ import annotations

import secrets
from collections.abc import Callable
from pathlib import Path


def secret_file(path: Path, make: Callable[[], str] = lambda: secrets.token_urlsafe(48)) -> str:
    """The file's text; on first use, ``make()`` it and write it readable by its owner only."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch(mode=0o600)
        path.write_text(make())
    return path.read_text().strip()
