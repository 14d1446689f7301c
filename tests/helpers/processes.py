"""Start the portal's real processes (Celery worker, daphne) against the test database.

The test database exists only inside the pytest run, so each helper process is
told its name through DATABASE_URL; tests that share rows with these
processes must commit them (``transactional_db``).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from django.conf import settings
from django.db import connection

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def test_database_url() -> str:
    """DATABASE_URL naming the database pytest-django created for this run."""
    db = connection.settings_dict
    if db["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{db['NAME']}"
    user = db.get("USER") or ""
    password = f":{db['PASSWORD']}" if db.get("PASSWORD") else ""
    auth = f"{user}{password}@" if user else ""
    return f"postgres://{auth}{db.get('HOST') or '127.0.0.1'}:{db.get('PORT') or 5432}/{db['NAME']}"


# A host whose Docker engine no one answers at, known to every helper process (the portal builds launch specs
# with it): a test's fleet may name it to see the host's own engine used, not this machine's.
ENGINE_GONE_HOST = "engine-gone"
GONE_ENGINE = "unix:///nonexistent/gpu-portal-far/docker.sock"


def child_env(**extra: str) -> dict[str, str]:
    from tests.conftest import STACK
    from tests.lab.lab import SWITCH_ADDRESS, TEST_LAB, Lab

    lab_engines = {node.name: node.endpoint for node in Lab(TEST_LAB).nodes}  # its hosts' engines, when it is up
    engines = {**settings.DOCKER_ENGINES, ENGINE_GONE_HOST: GONE_ENGINE, **lab_engines}
    env = dict(os.environ)
    env.update(
        DATABASE_URL=test_database_url(),
        REDIS_URL=settings.REDIS_URL,
        PORTAL_CELERY_QUEUE=settings.CELERY_TASK_DEFAULT_QUEUE,
        PORTAL_CACHE_PREFIX=str(settings.CACHES["default"]["KEY_PREFIX"]),
        PORTAL_CHANNEL_PREFIX=str(settings.CHANNEL_LAYERS["default"]["CONFIG"]["prefix"]),  # type: ignore[index]
        PORTAL_DATA_DIR=str(settings.DATA_DIR),
        PORTAL_RENDER_DIR=str(settings.RENDER_DIR),
        PORTAL_SECURE_COOKIES=os.environ.get("PORTAL_SECURE_COOKIES", "true"),
        PORTAL_PUBLIC_URL=settings.PUBLIC_URL,
        PORTAL_HUB_OAUTH_CALLBACK_URL=settings.HUB_OAUTH_CALLBACK_URL,
        PORTAL_HUB_API_URL=settings.HUB_API_URL,
        PORTAL_HUB_SERVICE_TOKEN=settings.HUB_SERVICE_TOKEN,
        PORTAL_INSTANCE_ID=settings.INSTANCE_ID,
        PORTAL_NOTEBOOK_NETWORK=settings.USER_NETWORK.name,
        PORTAL_NOTEBOOK_SUBNET=str(settings.USER_NETWORK.subnet),
        PORTAL_NOTEBOOK_INTERNET=str(settings.USER_NETWORK.internet).lower(),
        PORTAL_HUB_PORT=str(settings.USER_NETWORK.hub_port),
        PORTAL_BILLING_MIN_MINUTES=str(settings.BILLING_MIN_MINUTES),
        PORTAL_DOCKER_ENGINES="; ".join(f"{host}={endpoint}" for host, endpoint in engines.items()),
        # The portal's address as the lab's hosts reach it (through the relay): the session's portal answers there.
        PORTAL_FILE_STORE_URL=f"http://{SWITCH_ADDRESS}:{STACK['portal']}",
    )
    env.update(extra)
    return env


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_until(check: Callable[[], bool], timeout: float, what: str, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with code {process.returncode} before it was ready")
        if check():
            return
        time.sleep(0.1)
    raise TimeoutError(f"{what} was not ready within {timeout} s")


def answers_200(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def ready_or_stopped(
    process: subprocess.Popen[bytes], check: Callable[[], bool], timeout: float, what: str
) -> subprocess.Popen[bytes]:
    """Wait for a helper process to answer; if it does not, stop it and say so."""
    try:
        wait_until(check, timeout, what, process)
    except Exception:
        stop(process)
        raise
    return process


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def start_daphne(port: int, log_path: Path, **extra: str) -> subprocess.Popen[bytes]:
    """Daphne on ``port``; ``extra`` adds to (or overrides) the environment every helper process gets."""
    log = log_path.open("ab")
    process = subprocess.Popen(
        [str(BIN / "daphne"), "--bind", "127.0.0.1", "--port", str(port), "portal.asgi:application"],
        cwd=ROOT,
        env=child_env(**extra),
        stdout=log,
        stderr=subprocess.STDOUT,
    )

    return ready_or_stopped(process, lambda: answers_200(f"http://127.0.0.1:{port}/healthz"), 30, "daphne")


def start_celery_worker(name: str, log_path: Path, **extra: str) -> subprocess.Popen[bytes]:
    """A worker on the test run's queue (or ``PORTAL_CELERY_QUEUE`` in ``extra``, which adds to its environment)."""
    from portal.celery import app

    log = log_path.open("ab")
    process = subprocess.Popen(
        [
            str(BIN / "celery"),
            "--app",
            "portal",
            "worker",
            "--pool",
            "solo",
            "--queues",
            extra.get("PORTAL_CELERY_QUEUE", settings.CELERY_TASK_DEFAULT_QUEUE),
            "--hostname",
            name,
            "--without-gossip",
            "--without-mingle",
            "--loglevel",
            "INFO",
        ],
        cwd=ROOT,
        env=child_env(**extra),
        stdout=log,
        stderr=subprocess.STDOUT,
    )

    return ready_or_stopped(process, lambda: bool(app.control.ping(destination=[name], timeout=0.5)), 60, "worker")


def start_billing_beat(
    every: float, folder: Path, entries: tuple[str, ...] = ("billing-minute",), **extra: str
) -> subprocess.Popen[bytes]:
    """A real Celery beat that sends billing's ``entries`` every ``every`` seconds (tests/helpers/billing_beat.py),
    its schedule and log in ``folder``, ``extra`` added to its environment; ready once it has sent a tick."""
    folder.mkdir(parents=True, exist_ok=True)
    log_path = folder / "beat.log"
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.helpers.billing_beat", str(every), str(folder / "schedule"), *entries],
        cwd=ROOT,
        env=child_env(**extra),
        stdout=log_path.open("ab"),
        stderr=subprocess.STDOUT,
    )
    sent = "billing.tasks.charge_accrued"
    return ready_or_stopped(process, lambda: sent in log_path.read_text(errors="replace"), 60, "beat")


def start_hub(stack: dict[str, int], data_dir: Path, log_path: Path) -> subprocess.Popen[bytes]:
    """JupyterHub with our config; it starts configurable-http-proxy on the public port itself."""
    log = log_path.open("ab")
    env = child_env(
        PORTAL_INTERNAL_URL=f"http://127.0.0.1:{stack['portal']}",
        PORTAL_PROXY_API_PORT=str(stack["proxy_api"]),
        PORTAL_HUB_DATA_DIR=str(data_dir),
        PYTHONPATH=str(ROOT),
    )
    process = subprocess.Popen(
        [str(BIN / "jupyterhub"), "-f", str(ROOT / "compose/hub/jupyterhub_config.py")],
        cwd=data_dir,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )

    hub_api = f"http://127.0.0.1:{stack['public']}/jupyter/hub/api/"
    return ready_or_stopped(process, lambda: answers_200(hub_api), 60, "jupyterhub")


def start_gpu_agent(fleet: str, log_path: Path, interval_ms: int = 250, **extra: str) -> subprocess.Popen[bytes]:
    """The GPU agent on a simulated fleet, as the run command starts it; ready once it has published. ``extra``
    adds to its environment."""
    import redis

    from sessions.metrics.agent import latest_key

    client = redis.Redis.from_url(settings.REDIS_URL)
    client.delete(latest_key())
    log = log_path.open("ab")
    process = subprocess.Popen(
        [sys.executable, "manage.py", "gpu_agent", "--interval-ms", str(interval_ms), "--no-docker"],
        cwd=ROOT,
        env=child_env(PORTAL_GPU_BACKEND="simulated", PORTAL_SIMULATED_FLEET=fleet, **extra),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    return ready_or_stopped(process, lambda: bool(client.hlen(latest_key())), 30, "gpu agent")
