from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.conf import settings

from tests.lab.fleet import devices, fleet_spec
from tests.lab.lab import Lab

TEST_LAB = "gplt"  # not the lab `make lab-up` builds (gpl), so the two never meet
BUSYBOX = "gpu-portal/busybox:latest"


@pytest.fixture(scope="module")
def lab(docker_engine: str) -> Iterator[Lab]:
    """Three GPU hosts with their own engines in one Swarm, taken down after the module, whatever happened."""
    built = Lab(TEST_LAB, devices=devices(fleet_spec(TEST_LAB)), relay=services())
    built.down()  # whatever an interrupted run left
    built.up(images=[BUSYBOX])
    yield built
    built.down()


def services() -> dict[int, int]:
    """The ports of this machine's PostgreSQL and Redis (127.0.0.1), offered to the lab's hosts on the switch."""
    from redis.connection import parse_url

    database = int(str(settings.DATABASES["default"].get("PORT") or 5432))
    redis = int(str(parse_url(settings.REDIS_URL).get("port", 6379)))
    return {database: database, redis: redis}
