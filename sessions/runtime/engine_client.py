"""The low-level client of one Docker engine, for the hub's spawner: it runs inside the hub's process, so this
module imports nothing of Django (``sessions.runtime.docker`` is the portal's adapter)."""

from __future__ import annotations

from typing import Any

import docker


class EngineUnreachable(RuntimeError):
    """An engine did not answer; the message names it."""


def api_client(endpoint: str, **kwargs: Any) -> docker.APIClient:
    """A client of the engine at ``endpoint``; it asks the engine its API version as it is made."""
    try:
        return docker.APIClient(base_url=endpoint, version="auto", **kwargs)
    except docker.errors.DockerException as error:
        raise EngineUnreachable(
            f"The Docker engine {endpoint} of the session's host does not answer: {error}"
        ) from None
