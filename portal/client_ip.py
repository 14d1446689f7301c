"""The address a request really came from, behind configurable-http-proxy.

Everything reaches daphne through the proxy on 127.0.0.1, so per-address
login throttling must read the address the proxy appended to
X-Forwarded-For (the right-most ones it added), never a value a client sent.
"""

from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest

LOCAL_PROXIES = {"127.0.0.1", "::1"}


def client_ip(request: HttpRequest) -> str:
    remote = str(request.META.get("REMOTE_ADDR", ""))
    hops = int(settings.TRUSTED_PROXY_HOPS)
    forwarded = [part.strip() for part in str(request.META.get("HTTP_X_FORWARDED_FOR", "")).split(",") if part.strip()]
    if hops and remote in LOCAL_PROXIES and forwarded:
        return forwarded[-min(hops, len(forwarded))]
    return remote
