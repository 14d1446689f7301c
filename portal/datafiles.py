"""Secrets the portal makes for itself once and keeps in its data directory (mode 600)."""

from __future__ import annotations

import contextlib
import os
import secrets
import tempfile
from collections.abc import Callable
from pathlib import Path


def secret_file(path: Path, make: Callable[[], str] = lambda: secrets.token_urlsafe(48)) -> str:
    """The file's text; on first use, ``make()`` it and write it readable by its owner only.

    The new secret is written aside and linked into place, so processes starting at the same moment
    (the hub and the proxy under make run) agree on one secret and never read a half-written file.
    """
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, aside = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")  # mode 600
        try:
            with os.fdopen(handle, "w") as out:
                out.write(make())
            with contextlib.suppress(FileExistsError):  # another process was first: its secret stands
                os.link(aside, path)
        finally:
            os.unlink(aside)
    return path.read_text().strip()
