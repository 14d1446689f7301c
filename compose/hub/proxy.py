"""The public entry as a program of its own (make run's supervisor): the one public address.

compose/hub/gate.mjs is configurable-http-proxy with a gate on request bodies (their limits from
portal/entrylimits.py, the same as the tests' hub passes). It sends /jupyter/ to the hub and the notebook
servers, everything else to daphne, so a hub that crashes leaves the portal's pages up. The hub reaches
its API with the same token (read from <data dir>/proxy_auth_token, made once) and puts its routes back
when the proxy comes back empty (jupyterhub_config.py, PORTAL_HUB_STARTS_PROXY=false). Started as
JupyterHub itself would start it; this process becomes the proxy (exec), so the supervisor's pid is the
proxy's.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from portal import entrylimits  # noqa: E402
from portal.datafiles import secret_file  # noqa: E402
from sessions.runtime.network import from_environ  # noqa: E402

PROXY = ROOT / "compose/hub/gate.mjs"


def auth_token(environ: dict[str, str]) -> str:
    data = Path(environ.get("PORTAL_DATA_DIR") or ROOT / "var").resolve()
    return environ.get("CONFIGPROXY_AUTH_TOKEN") or secret_file(
        data / "proxy_auth_token", variable="CONFIGPROXY_AUTH_TOKEN"
    )


def command(environ: dict[str, str]) -> list[str]:
    hub = from_environ(environ).hub_url
    return [
        str(PROXY),
        "--ip",
        environ.get("PORTAL_PROXY_IP", "127.0.0.1"),  # 0.0.0.0 in its container (compose/compose.yaml)
        "--port",
        environ.get("PORTAL_PORT", "8000"),
        "--api-ip",
        environ.get("PORTAL_PROXY_API_IP", "127.0.0.1"),
        "--api-port",
        environ.get("PORTAL_PROXY_API_PORT", "8001"),
        "--default-target",
        environ.get("PORTAL_INTERNAL_URL", "http://127.0.0.1:8002"),
        # Where a server that does not answer sends people: the hub's error page, as when the hub runs the proxy.
        "--error-target",
        f"{hub}/jupyter/hub/error",
        # warn: the hub's route checks every 10 s would otherwise fill the console; route changes are the hub's log
        "--log-level",
        "warn",
        *entrylimits.from_environ(environ).gate_arguments(),
    ]


if __name__ == "__main__":
    environ = dict(os.environ)
    environ["CONFIGPROXY_AUTH_TOKEN"] = auth_token(environ)
    argv = command(environ)
    os.execve(argv[0], argv, environ)  # noqa: S606  # a fixed program and arguments, no shell
