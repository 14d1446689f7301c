"""Redis and PostgreSQL with passwords: every part of the portal takes them from REDIS_URL and DATABASE_URL."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.processes import free_port

ROOT = Path(__file__).resolve().parents[2]
PASSWORD = "s3cr@t pass"  # an @ and a space: both must survive URL-encoding
ENCODED = "s3cr%40t%20pass"

# Run in a fresh process with REDIS_URL set: the cache, the channel layer, Celery's broker and the agent's client.
USE_REDIS = """
import asyncio, django, redis
django.setup()
from django.conf import settings
from django.core.cache import cache
from channels.layers import get_channel_layer
from portal.celery import app

cache.set("password-check", "cached", 30)
assert cache.get("password-check") == "cached"

async def round_trip():
    layer = get_channel_layer()
    channel = await layer.new_channel()
    await layer.send(channel, {"type": "hello"})
    return (await layer.receive(channel))["type"]

assert asyncio.run(round_trip()) == "hello"
with app.connection_for_write() as connection:
    connection.ensure_connection(max_retries=1)
assert redis.Redis.from_url(settings.REDIS_URL).ping()
print("all four connected")
"""


@pytest.fixture
def redis_with_password() -> Iterator[int]:
    port = free_port()
    options = ["--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no"]
    subprocess.run(["redis-server", "--daemonize", "yes", *options, "--requirepass", PASSWORD], check=True)
    yield port
    subprocess.run(["redis-cli", "-p", str(port), "-a", PASSWORD, "--no-auth-warning", "shutdown"], check=False)


def run(command: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command, cwd=ROOT, env={**os.environ, **env}, capture_output=True, text=True, timeout=60, check=False
    )


def test_the_setup_script_speaks_to_redis_with_its_password(redis_with_password: int) -> None:
    url = f"redis://:{ENCODED}@127.0.0.1:{redis_with_password}/0"
    assert run(["compose/bin/ensure-redis"], REDIS_URL=url).returncode == 0


def test_the_setup_script_says_when_the_password_is_missing_or_wrong(redis_with_password: int) -> None:
    missing = run(["compose/bin/ensure-redis"], REDIS_URL=f"redis://127.0.0.1:{redis_with_password}/0")
    assert missing.returncode == 1 and "needs a password; put it in REDIS_URL" in missing.stderr
    wrong = run(["compose/bin/ensure-redis"], REDIS_URL=f"redis://:nope@127.0.0.1:{redis_with_password}/0")
    assert wrong.returncode == 1 and "refuses the password" in wrong.stderr


def test_cache_channel_layer_broker_and_agent_use_the_password_in_redis_url(redis_with_password: int) -> None:
    url = f"redis://:{ENCODED}@127.0.0.1:{redis_with_password}/2"
    done = run([sys.executable, "-c", USE_REDIS], REDIS_URL=url, DJANGO_SETTINGS_MODULE="portal.settings")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "all four connected" in done.stdout


def test_a_database_url_with_a_password_reaches_django_decoded(tmp_path: Path) -> None:
    url = f"postgres://portal:{ENCODED}@127.0.0.1:5432/portal"
    shown = run(
        [
            sys.executable,
            "-c",
            "import django; django.setup(); from django.conf import settings as s; "
            "d = s.DATABASES['default']; print(d['USER'], '|', d['PASSWORD'], '|', d['HOST'])",
        ],
        DATABASE_URL=url,
        DJANGO_SETTINGS_MODULE="portal.settings",
        PORTAL_DATA_DIR=str(tmp_path),
    )
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert shown.stdout.strip() == f"portal | {PASSWORD} | 127.0.0.1"
