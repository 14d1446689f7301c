"""``PORTAL_DOCKER_ENGINES`` read at settings time (no model, no Docker import): each GPU host's engine that is
not this machine's (``sessions.runtime.engines`` uses it)."""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured

SCHEMES = ("unix://", "tcp://", "ssh://")


def parse(text: str) -> dict[str, str]:
    """``host=endpoint; host=endpoint`` as a mapping; ImproperlyConfigured naming the part that is wrong."""
    engines: dict[str, str] = {}
    for part in filter(None, (piece.strip() for piece in text.split(";"))):
        host, _, endpoint = (side.strip() for side in part.partition("="))
        if not host or not endpoint:
            raise ImproperlyConfigured(f"PORTAL_DOCKER_ENGINES: {part!r} is not host=endpoint")
        if not endpoint.startswith(SCHEMES):
            raise ImproperlyConfigured(
                f"PORTAL_DOCKER_ENGINES: {host}'s endpoint {endpoint!r} is not unix://, tcp:// or ssh://"
            )
        if host in engines:
            raise ImproperlyConfigured(f"PORTAL_DOCKER_ENGINES names {host} twice")
        engines[host] = endpoint
    return engines
