"""The public entry as make run starts it (compose/hub/proxy.py, the gate in front of configurable-http-proxy) in
front of a daphne of its own, with the run's Celery worker beside them; and the bounds on their memory."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import ARTIFACTS
from tests.helpers import processes

ROOT = Path(__file__).resolve().parents[2]
MiB = 1024 * 1024
TOKEN = "body-limits-test-token"
# What each process may reach while bodies of several GiB arrive: daphne and the worker idle at ~100-150 MiB,
# the proxy at ~60 MiB; the entry lets at most PORTAL_PROXY_BODIES_AT_ONCE bodies of at most 8 MiB reach daphne.
BOUNDS = {"daphne": 300 * MiB, "proxy": 200 * MiB, "worker": 300 * MiB}


@dataclass
class Entry:
    port: int
    api: str
    pids: dict[str, int]


def pid_of(*words: str) -> int:
    """The process whose command line holds every one of ``words``."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                command = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if all(word.encode() in command for word in words):
                return int(entry.name)
    raise LookupError(f"no process runs with {words}")


@pytest.fixture(scope="session")
def entry(django_db_setup: None, celery_worker: str) -> Iterator[Entry]:
    subprocess.run([str(ROOT / "compose/bin/ensure-proxy")], check=True)
    daphne_port, port, api_port = processes.free_port(), processes.free_port(), processes.free_port()
    log_path = ARTIFACTS / "logs" / "daphne-bodies.log"
    daphne = processes.start_daphne(daphne_port, log_path)
    env = processes.child_env(
        PORTAL_PORT=str(port),
        PORTAL_PROXY_API_PORT=str(api_port),
        PORTAL_INTERNAL_URL=f"http://127.0.0.1:{daphne_port}",
        CONFIGPROXY_AUTH_TOKEN=TOKEN,
    )
    log = (ARTIFACTS / "logs" / "proxy-bodies.log").open("ab")
    proxy = subprocess.Popen(
        [sys.executable, str(ROOT / "compose/hub/proxy.py")], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
    )
    try:
        processes.wait_until(
            lambda: processes.answers_200(f"http://127.0.0.1:{port}/healthz"), 30, "the public entry", proxy
        )
        pids = {"daphne": daphne.pid, "proxy": proxy.pid, "worker": pid_of("--hostname", celery_worker)}
        yield Entry(port, f"http://127.0.0.1:{api_port}", pids)
    finally:
        processes.stop(proxy)
        processes.stop(daphne)
