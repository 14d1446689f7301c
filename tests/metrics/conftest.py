"""The GPU tests' simulated fleets serve the metrics tests too; ``store`` is Redis with no latest frames."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
from django.conf import settings

from sessions.metrics.agent import latest_key
from tests.gpus.conftest import make_fleet

__all__ = ["make_fleet", "store"]


@pytest.fixture
def store() -> Iterator[redis.Redis]:
    """Redis, its hash of the agents' latest frames emptied before and after."""
    client = redis.Redis.from_url(settings.REDIS_URL)
    client.delete(latest_key())
    yield client
    client.delete(latest_key())
    client.close()
