from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest
from django.conf import settings

from tests.conftest import ARTIFACTS, ROOT, STACK
from tests.helpers.processes import child_env, free_port
from tests.lab.fleet import devices, fleet_spec
from tests.lab.lab import BUSYBOX, NOTEBOOK, SWITCH_ADDRESS, TEST_LAB, Lab

# The lab hub's ports, inside the switch's namespace; the public one is carried in from this machine's 127.0.0.1.
LAB_PORTS = {name: free_port() for name in ("public", "hub", "proxy_api")}
LAB_HUB_URL = f"http://{SWITCH_ADDRESS}:{LAB_PORTS['hub']}"  # where the lab's notebooks reach its hub


@pytest.fixture(scope="session")
def lab(docker_engine: str) -> Iterator[Lab]:
    """Three GPU hosts with their own engines in one Swarm, with the test and notebook images, the relay to this
    machine's PostgreSQL, Redis and portal, and the lab hub's public port carried in; built once for the run
    and taken down at its end, whatever happened."""
    subprocess.run([str(ROOT / "compose/bin/build-notebook-image")], check=True)
    relay = {**services(), STACK["portal"]: STACK["portal"]}
    public = {LAB_PORTS["public"]: LAB_PORTS["public"]}
    built = Lab(TEST_LAB, devices=devices(fleet_spec(TEST_LAB)), relay=relay, relay_into=public)
    built.down()  # whatever an interrupted run left
    built.up(images=[BUSYBOX, NOTEBOOK])
    for node in built.nodes:  # as an operator provisions each GPU host, before its notebooks start
        fence = [sys.executable, "manage.py", "fence_swarm_host", f"--hub={LAB_HUB_URL}"]
        done = built.start_in(node, fence, child_env(), ARTIFACTS / "logs" / f"lab-fence-{node.name}.log").wait(60)
        assert done == 0, (ARTIFACTS / "logs" / f"lab-fence-{node.name}.log").read_text()[-2000:]
    yield built
    built.down()


@pytest.fixture
def prices(transactional_db: None) -> None:
    """The starting prices, which a transactional test before this one may have flushed with the migration's
    rows: without them no holding would be charged, and the invariants would hold for nothing."""
    from billing import seeds
    from billing.models import Price

    seeds.ensure(Price)


def services() -> dict[int, int]:
    """The ports of this machine's PostgreSQL and Redis (127.0.0.1), offered to the lab's hosts on the switch."""
    from redis.connection import parse_url

    database = int(str(settings.DATABASES["default"].get("PORT") or 5432))
    redis = int(str(parse_url(settings.REDIS_URL).get("port", 6379)))
    return {database: database, redis: redis}
