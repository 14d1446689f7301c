from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.lab.fleet import devices, fleet_spec
from tests.lab.lab import Lab

TEST_LAB = "gplt"  # not the lab `make lab-up` builds (gpl), so the two never meet
BUSYBOX = "gpu-portal/busybox:latest"


@pytest.fixture(scope="module")
def lab(docker_engine: str) -> Iterator[Lab]:
    """Three GPU hosts with their own engines in one Swarm, taken down after the module, whatever happened."""
    built = Lab(TEST_LAB, devices=devices(fleet_spec(TEST_LAB)))
    built.down()  # whatever an interrupted run left
    built.up(images=[BUSYBOX])
    yield built
    built.down()
