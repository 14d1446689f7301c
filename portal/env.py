"""Typed readers for environment variables.

Every setting the portal takes from the environment goes through these
helpers, so a bad value stops start-up with a message naming the variable.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

TRUE_WORDS = {"1", "true", "yes", "on"}
FALSE_WORDS = {"0", "false", "no", "off", ""}


class Env:
    """Reads variables from a mapping (os.environ by default)."""

    def __init__(self, source: Mapping[str, str] | None = None) -> None:
        self.source = os.environ if source is None else source

    def raw(self, name: str) -> str | None:
        value = self.source.get(name)
        return None if value is None else value.strip()

    def secret(self, name: str) -> str:
        """A password as given: its spaces are part of it, so nothing is stripped ('' when unset)."""
        return self.source.get(name, "")

    def text(self, name: str, default: str) -> str:
        value = self.raw(name)
        return default if value is None or value == "" else value

    def flag(self, name: str, default: bool) -> bool:
        value = self.raw(name)
        if value is None:
            return default
        lowered = value.lower()
        if lowered in TRUE_WORDS:
            return True
        if lowered in FALSE_WORDS:
            return False
        raise ImproperlyConfigured(f"{name} must be true or false (got {value!r}).")

    def integer(self, name: str, default: int, minimum: int | None = None) -> int:
        value = self.raw(name)
        if value is None or value == "":
            return default
        try:
            number = int(value)
        except ValueError:
            raise ImproperlyConfigured(f"{name} must be a whole number (got {value!r}).") from None
        if minimum is not None and number < minimum:
            raise ImproperlyConfigured(f"{name} must be at least {minimum} (got {number}).")
        return number

    def items(self, name: str, default: list[str]) -> list[str]:
        value = self.raw(name)
        if value is None:
            return default
        return [item.strip() for item in value.split(",") if item.strip()]

    def choice(self, name: str, default: str, choices: Mapping[str, str]) -> str:
        """Map a short word to a value, e.g. 'console' to an email backend path."""
        value = self.text(name, default)
        if value in choices:
            return choices[value]
        allowed = ", ".join(sorted(choices))
        raise ImproperlyConfigured(f"{name} must be one of {allowed} (got {value!r}).")

    def minutes_map(self, name: str, default: dict[str, int]) -> dict[str, int]:
        """Parse 'whole=20, 7g.141gb=15' into {'whole': 20, '7g.141gb': 15}."""
        value = self.raw(name)
        if value is None:
            return default
        result: dict[str, int] = {}
        for item in filter(None, (piece.strip() for piece in value.split(","))):
            key, _, minutes = item.partition("=")
            if not key.strip() or not minutes.strip().isdigit() or int(minutes) < 1:
                raise ImproperlyConfigured(f"{name} must look like 'whole=20, 7g.141gb=15' (got {item!r}).")
            result[key.strip()] = int(minutes)
        return result

    def path(self, name: str, default: Path) -> Path:
        value = self.raw(name)
        return default if not value else Path(value).expanduser().resolve()
