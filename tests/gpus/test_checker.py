"""The independent checker must be able to fail, or its silence proves nothing."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.utils import timezone

from sessions.gpus.models import Gpu, Slice
from tests.gpus import checker
from tests.gpus.conftest import FleetMaker


def forge(gpu: Gpu, owner: User, profile: str, start: int, size: int, compute: int, device: str) -> None:
    Slice.objects.create(
        gpu=gpu,
        kind="mig",
        profile=profile,
        placement_start=start,
        placement_size=size,
        compute_slices=compute,
        device_uuid=device,
        owner=owner,
        allocated_at=timezone.now(),
    )


def test_the_checker_catches_overlaps_bad_starts_and_overfull_gpus(make_fleet: FleetMaker, alice: User) -> None:
    gpu = make_fleet("chk: 1xH200:mig")[0]
    forge(gpu, alice, "3g.71gb", 0, 4, 3, "MIG-a")
    forge(gpu, alice, "2g.35gb", 2, 2, 2, "MIG-b")
    forge(gpu, alice, "3g.71gb", 2, 4, 3, "MIG-c")
    found = "\n".join(checker.problems())
    assert "2g.35gb@2 overlaps another slice" in found
    assert "3g.71gb at illegal start 2" in found
    assert "8 compute slices in use of 7" in found


def test_the_checker_catches_an_overfull_shared_gpu(make_fleet: FleetMaker, alice: User) -> None:
    gpu = make_fleet("chk: 1xL4:shared=2")[0]
    for _ in range(3):
        Slice.objects.create(gpu=gpu, kind="shared", device_uuid=gpu.uuid, owner=alice, allocated_at=timezone.now())
    assert checker.problems() == [f"{gpu.uuid}: 3 shares, limit 2"]


def test_the_database_itself_refuses_a_second_tenant_on_a_whole_gpu(make_fleet: FleetMaker, alice: User) -> None:
    gpu = make_fleet("chk: 1xL4:whole")[0]
    Slice.objects.create(gpu=gpu, kind="whole", device_uuid=gpu.uuid, owner=alice, allocated_at=timezone.now())
    with pytest.raises(IntegrityError), transaction.atomic():
        Slice.objects.create(gpu=gpu, kind="whole", device_uuid=gpu.uuid, owner=alice, allocated_at=timezone.now())
