"""The JupyterHub REST API, as the portal uses it: the only module that talks to the hub.

The portal is a hub service whose token has the scopes it needs and no more:
``admin:users`` (a person must exist in the hub before a server can start for
them) and ``servers`` (start, stop and read named servers).
"""

from __future__ import annotations

import json
import socket
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import requests
from django.conf import settings

TIMEOUT = 10


class HubError(RuntimeError):
    """The hub refused or did not answer; the message says what was asked."""


class HubUnavailable(HubError):
    """The hub did not answer (down, restarting, overloaded): worth asking again later."""


@dataclass(frozen=True)
class ServerStatus:
    ready: bool
    pending: str | None
    url: str
    last_activity: str | None
    options: dict[str, Any] = field(default_factory=dict)  # the user_options it was started with


def _check_hub_address(api_url: str, what: str) -> None:
    """The hub listens on the user network's gateway; if that bridge is not set up, the address is not this
    host's and a request would be routed off the machine. Refuse at once, saying what to do."""
    network = settings.USER_NETWORK
    if not network.isolated or urlsplit(api_url).hostname != network.gateway:
        return
    with socket.socket() as probe:
        try:
            probe.bind((network.gateway, 0))
        except OSError:
            raise HubUnavailable(
                f"could not reach JupyterHub to {what}: {network.gateway} is not an address of this host; "
                "create the user network first (manage.py ensure_user_network)"
            ) from None


def _status(server: dict[str, Any]) -> ServerStatus:
    options = server.get("user_options") or {}
    return ServerStatus(
        bool(server.get("ready")), server.get("pending"), server.get("url", ""), server.get("last_activity"), options
    )


class Hub:
    def __init__(self, api_url: str | None = None, token: str | None = None) -> None:
        self.api_url = (api_url or settings.HUB_API_URL).rstrip("/")
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"token {token or settings.HUB_SERVICE_TOKEN}"

    def _call(self, method: str, path: str, what: str, ok: tuple[int, ...], **kwargs: Any) -> requests.Response:
        _check_hub_address(self.api_url, what)
        try:
            response = self.session.request(method, f"{self.api_url}{path}", timeout=TIMEOUT, **kwargs)
        except requests.RequestException as error:
            raise HubUnavailable(f"could not reach JupyterHub to {what}: {error}") from None
        if response.status_code in (502, 503, 504) and response.status_code not in ok:
            raise HubUnavailable(f"JupyterHub was unavailable to {what}: HTTP {response.status_code}")
        if response.status_code not in ok:
            raise HubError(f"JupyterHub refused to {what}: HTTP {response.status_code} {response.text[:300]}")
        return response

    def ensure_user(self, name: str) -> None:
        # One call, not a look-up first: 409 says the hub knows them already. Each call waits its turn in
        # the hub's one event loop, which is busiest exactly when many people launch at once.
        self._call("POST", f"/users/{name}", f"create {name}", (201, 409))

    def start_server(self, user: str, server: str, options: dict[str, Any]) -> None:
        """Start a named server, making the person in the hub first if the hub does not know them yet.

        Asking again for a server the hub already starts or runs with these same options is no error: the
        hub answers 202 while it spawns, but 400 once it runs, and a second ask (a start task sent twice)
        must not read as a refusal. A server of that name started with other options is one.
        """
        body, path, what = {"user_options": options}, f"/users/{user}/servers/{server}", f"start {user}/{server}"
        response = self._call("POST", path, what, (201, 202, 400, 404), json=body)
        if response.status_code == 404:
            self.ensure_user(user)
            response = self._call("POST", path, what, (201, 202, 400), json=body)
        if response.status_code == 400 and not self.started_with(user, server, options):
            raise HubError(f"JupyterHub refused to {what}: HTTP 400 {response.text[:300]}")

    def started_with(self, user: str, server: str, options: dict[str, Any]) -> bool:
        """The hub spawns or runs this named server, started with these options."""
        status = self.servers(user).get(server)
        return status is not None and status.options == options and (status.ready or status.pending == "spawn")

    def stop_server(self, user: str, server: str) -> None:
        what = f"stop {user}/{server}"
        self._call("DELETE", f"/users/{user}/servers/{server}", what, (202, 204, 400, 404), json={"remove": True})

    def servers(self, user: str) -> dict[str, ServerStatus]:
        response = self._call("GET", f"/users/{user}", f"read {user}", (200, 404))
        if response.status_code == 404:
            return {}
        found = response.json().get("servers", {})
        return {name: _status(server) for name, server in found.items()}

    def progress(self, user: str, server: str, timeout: float = 120) -> list[dict[str, Any]]:
        """The spawn progress stream of a starting server, read to its end (ready or failed).

        A server that is already running gives just the hub's ready event.
        """
        events: list[dict[str, Any]] = []
        path = f"/users/{user}/servers/{server}/progress"
        deadline = time.monotonic() + timeout
        try:
            with self.session.get(
                f"{self.api_url}{path}", stream=True, timeout=TIMEOUT, headers={"Accept": "text/event-stream"}
            ) as response:
                if response.status_code != 200:
                    raise HubError(f"JupyterHub refused the progress of {user}/{server}: HTTP {response.status_code}")
                for line in response.iter_lines(decode_unicode=True):
                    if line and line.startswith("data:"):
                        event = json.loads(line[5:])
                        events.append(event)
                        if event.get("ready") or event.get("failed"):
                            break
                    if time.monotonic() > deadline:
                        raise HubError(f"the progress of {user}/{server} did not end within {timeout} s")
        except requests.RequestException as error:
            raise HubError(f"could not read the progress of {user}/{server}: {error}") from None
        return events
