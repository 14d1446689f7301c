"""``PORTAL_DOCKER_ENGINES`` read at settings time (no model, no Docker import): each GPU host's engine that is
not this machine's (``sessions.runtime.engines`` uses it), and ``PORTAL_DOCKER_TLS_DIR``, the certificates a
``tcp://`` engine is reached with."""

from __future__ import annotations

import re
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

KUBE = "kube://"  # a namespace of a Kubernetes cluster, not a Docker engine (sessions/runtime/kube/)
SCHEMES = ("unix://", "tcp://", "ssh://", KUBE)
# Docker's names for them (its "protect the daemon socket" set-up): the CA that signed the engines' and the
# portal's certificates, and the portal's client certificate and key.
TLS_FILES = ("ca.pem", "cert.pem", "key.pem")
# kube://NAMESPACE: the host's notebook servers are pods of the cluster the portal runs in (issue 34).
NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


def parse(text: str, tls_dir: str = "") -> dict[str, str]:
    """``host=endpoint; host=endpoint`` as a mapping; ImproperlyConfigured naming the part that is wrong. A
    ``tcp://`` engine needs ``tls_dir``: an engine's TCP port without TLS is root on its host to anyone who
    reaches it."""
    engines: dict[str, str] = {}
    for part in filter(None, (piece.strip() for piece in text.split(";"))):
        host, _, endpoint = (side.strip() for side in part.partition("="))
        if not host or not endpoint:
            raise ImproperlyConfigured(f"PORTAL_DOCKER_ENGINES: {part!r} is not host=endpoint")
        if not endpoint.startswith(SCHEMES):
            raise ImproperlyConfigured(
                f"PORTAL_DOCKER_ENGINES: {host}'s endpoint {endpoint!r} is not unix://, tcp://, ssh:// or kube://"
            )
        if host in engines:
            raise ImproperlyConfigured(f"PORTAL_DOCKER_ENGINES names {host} twice")
        if endpoint.startswith("kube://") and not NAMESPACE.match(endpoint.removeprefix("kube://")):
            raise ImproperlyConfigured(
                f"PORTAL_DOCKER_ENGINES: {host}'s endpoint {endpoint} must name a Kubernetes namespace (kube://NAME)"
            )
        if endpoint.startswith("tcp://") and not tls_dir:
            raise ImproperlyConfigured(
                f"PORTAL_DOCKER_ENGINES: {host}'s endpoint {endpoint} is TCP, which needs PORTAL_DOCKER_TLS_DIR "
                f"({', '.join(TLS_FILES)}): an engine's TCP port without TLS is root on its host to anyone who "
                "reaches it"
            )
        engines[host] = endpoint
    check_tls_dir(tls_dir)
    return engines


def check_tls_dir(tls_dir: str) -> None:
    if not tls_dir:
        return
    missing = [name for name in TLS_FILES if not (Path(tls_dir) / name).is_file()]
    if missing:
        raise ImproperlyConfigured(f"PORTAL_DOCKER_TLS_DIR: {tls_dir} has no {', '.join(missing)}")
