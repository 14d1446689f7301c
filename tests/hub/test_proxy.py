"""The public entry (configurable-http-proxy behind the body gate) as the one address: the portal by default, other
routes by API."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from portal import entrylimits
from tests.helpers.processes import free_port, stop, wait_until

pytestmark = pytest.mark.hub
ROOT = Path(__file__).resolve().parents[2]
PROXY = ROOT / "compose/hub/gate.mjs"
TOKEN = "proxy-test-token"


class Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = f"hello from {self.path}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        return


@pytest.fixture
def upstream() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hello)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.fixture
def proxy(portal_server: str) -> Iterator[tuple[str, str]]:
    subprocess.run([str(ROOT / "compose/bin/ensure-proxy")], check=True)
    port, api_port = free_port(), free_port()
    process = subprocess.Popen(
        [
            str(PROXY),
            "--ip=127.0.0.1",
            f"--port={port}",
            "--api-ip=127.0.0.1",
            f"--api-port={api_port}",
            f"--default-target={portal_server}",
            "--log-level=warn",
            *entrylimits.from_environ().gate_arguments(),
        ],
        env={**os.environ, "CONFIGPROXY_AUTH_TOKEN": TOKEN},
    )

    def answers() -> bool:
        try:
            return get(f"http://127.0.0.1:{port}/healthz") == "ok"
        except OSError:
            return False

    wait_until(answers, 30, "configurable-http-proxy", process)
    yield f"http://127.0.0.1:{port}", f"http://127.0.0.1:{api_port}"
    stop(process)


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        return str(response.read().decode())


def test_the_proxy_sends_everything_else_to_the_portal(proxy: tuple[str, str]) -> None:
    public, _ = proxy
    assert get(public + "/healthz") == "ok"
    assert "Log in" in get(public + "/accounts/login/")


def test_a_route_added_through_the_api_reaches_its_target(proxy: tuple[str, str], upstream: str) -> None:
    public, api = proxy
    request = urllib.request.Request(
        api + "/api/routes/jupyter",
        data=json.dumps({"target": upstream}).encode(),
        headers={"Authorization": f"token {TOKEN}"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=5) as response:
        assert response.status == 201
    assert get(public + "/jupyter/hub/") == "hello from /jupyter/hub/"
    assert get(public + "/healthz") == "ok"


def test_the_api_refuses_a_caller_without_the_token(proxy: tuple[str, str]) -> None:
    _, api = proxy
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(api + "/api/routes", timeout=5)
    assert refused.value.code == 403
