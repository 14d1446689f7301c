"""The low-level client of one Docker engine, for the hub's spawner: it runs inside the hub's process, so this
module imports nothing of Django (``sessions.runtime.docker`` is the portal's adapter)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import docker
from docker.tls import TLSConfig


class EngineUnreachable(RuntimeError):
    """An engine did not answer; the message names it."""


def tls_for(endpoint: str, tls_dir: str) -> TLSConfig | bool:
    """A tcp:// engine's TLS with the certificates in ``tls_dir`` (Docker's ca.pem, cert.pem, key.pem): ours
    shown, the engine's checked against the CA. No TLS for a socket, or where no folder is given (the portal's
    settings refuse a tcp:// engine without one)."""
    if not endpoint.startswith("tcp://") or not tls_dir:
        return False
    folder = Path(tls_dir)
    certificate = (str(folder / "cert.pem"), str(folder / "key.pem"))
    return TLSConfig(client_cert=certificate, ca_cert=str(folder / "ca.pem"), verify=True)


def api_client(endpoint: str, tls_dir: str = "", **kwargs: Any) -> docker.APIClient:
    """A client of the engine at ``endpoint``; it asks the engine its API version as it is made."""
    try:
        return docker.APIClient(base_url=endpoint, version="auto", tls=tls_for(endpoint, tls_dir), **kwargs)
    except docker.errors.DockerException as error:
        raise EngineUnreachable(
            f"The Docker engine {endpoint} of the session's host does not answer: {error}"
        ) from None
