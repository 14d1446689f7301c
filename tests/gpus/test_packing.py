"""Placement across hosts (issue 32, item 4): by default a slice goes to the host that holds the most slices
already (pack: whole hosts stay free, for whole-GPU requests and for draining); PORTAL_PLACEMENT=spread sends
it to the host that holds the fewest. The same for whole GPUs, time-sliced shares and MIG slices."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from sessions.gpus.allocator import SliceRequest, allocate, release
from sessions.gpus.models import Slice
from tests.gpus.conftest import FleetMaker

pytestmark = pytest.mark.django_db
FLEET = "a: 1xH200:mig, 2xL4:whole, 1xA30:shared=2; b: 1xH200:mig, 2xL4:whole, 1xA30:shared=2"


def host_of(taken: Slice) -> str:
    return str(taken.gpu.host.name)


@pytest.mark.parametrize("kind", ["whole", "shared"])
def test_by_default_slices_fill_one_host_before_the_next_and_spread_puts_them_apart(
    make_fleet: FleetMaker,
    alice: User,
    settings,
    kind: str,  # type: ignore[no-untyped-def]
) -> None:
    make_fleet(FLEET)
    model = "L4" if kind == "whole" else "A30"
    packed = [host_of(allocate(alice, SliceRequest(kind, model=model))) for _ in range(2)]
    assert packed[0] == packed[1], f"pack: the second {kind} slice joins the first's host"
    for held in Slice.objects.filter(released_at__isnull=True).values_list("pk", flat=True):
        release(held, "test")

    settings.PLACEMENT = "spread"
    spread = [host_of(allocate(alice, SliceRequest(kind, model=model))) for _ in range(2)]
    assert spread[0] != spread[1], f"spread: the second {kind} slice goes to the other host"


@pytest.mark.parametrize(("placement", "expected"), [("pack", "b"), ("spread", "a")])
def test_a_mig_slice_goes_to_the_busier_host_when_packing_and_the_idler_when_spreading(
    make_fleet: FleetMaker,
    alice: User,
    settings,
    placement: str,
    expected: str,  # type: ignore[no-untyped-def]
) -> None:
    """Both hosts' H200s are empty (one layout, on two hosts); host b holds a whole L4."""
    make_fleet(FLEET)
    allocate(alice, SliceRequest("whole", model="L4", host="b"))
    settings.PLACEMENT = placement
    taken = allocate(alice, SliceRequest("mig", "1g.18gb", model="H200"))
    assert host_of(taken) == expected
