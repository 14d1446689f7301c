"""Secrets the portal makes for itself once and keeps in its data directory (mode 600)."""

from __future__ import annotations

import contextlib
import os
import secrets
import tempfile
from collections.abc import Callable
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

from portal.env import Env

SECRETS_FROM_ENVIRONMENT = "PORTAL_SECRETS_FROM_ENVIRONMENT"


def secret_file(path: Path, make: Callable[[], str] = lambda: secrets.token_urlsafe(48), variable: str = "") -> str:
    """The file's text; on first use, ``make()`` it and write it readable by its owner only.

    ``variable`` names the setting that gives the secret instead. Where PORTAL_SECRETS_FROM_ENVIRONMENT is true
    (the containers of compose/compose.yaml, whose programs share no data folder), no secret is made: a
    missing one stops the program, naming the variable to set.

    The new secret is written aside and linked into place, so processes starting at the same moment
    (the hub and the proxy under make run) agree on one secret and never read a half-written file.
    """
    if Env().flag(SECRETS_FROM_ENVIRONMENT, False):
        raise ImproperlyConfigured(
            f"{variable or path.name} is not set: with {SECRETS_FROM_ENVIRONMENT}=true every secret is given, "
            "none is made (see compose/portal.env.example)"
        )
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
