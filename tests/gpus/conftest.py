"""A simulated fleet for GPU tests, described the way operators describe it (PORTAL_SIMULATED_FLEET)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from django.contrib.auth.models import User

from sessions.gpus import fleet
from sessions.gpus.backends import get_backend
from sessions.gpus.models import Gpu

FleetMaker = Callable[[str], list[Gpu]]


def use_fleet(settings, spec: str) -> list[Gpu]:  # type: ignore[no-untyped-def]
    settings.GPU_BACKEND = "simulated"
    settings.SIMULATED_FLEET = spec
    get_backend.cache_clear()
    fleet.sync_fleet()
    return list(Gpu.objects.filter(uuid__in=[g.uuid for g in get_backend().gpus.values()]).order_by("id"))  # type: ignore[attr-defined]


@pytest.fixture
def make_fleet(db: None, settings) -> Iterator[FleetMaker]:  # type: ignore[no-untyped-def]
    yield lambda spec: use_fleet(settings, spec)
    get_backend.cache_clear()


@pytest.fixture
def h200s(make_fleet: FleetMaker) -> list[Gpu]:
    return make_fleet("sim-1: 2xH200:mig, 1xA100-80GB:whole, 1xA30:shared=3")


@pytest.fixture
def many_slices(settings, alice: User) -> User:  # type: ignore[no-untyped-def]
    settings.MAX_SLICES_PER_USER = 100
    return alice
