"""Placement across hosts (issue 32, item 4): by default a slice goes to the host that holds the most slices
already (pack: whole hosts stay free, for whole-GPU requests and for draining); PORTAL_PLACEMENT=spread sends
it to the host that holds the fewest. The same for whole GPUs, time-sliced shares and MIG slices."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test.utils import CaptureQueriesContext

from sessions.gpus.allocator import SliceRequest, allocate, release
from sessions.gpus.models import Slice
from sessions.gpus.placement import first_fit
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


def test_choosing_the_host_of_a_mig_slice_costs_no_query_of_its_own(make_fleet: FleetMaker, alice: User) -> None:
    """The hosts' load comes with the first look at the layouts: a MIG request that two hosts could serve runs
    as many statements as one that only host a can."""
    make_fleet("a: 1xA100-80GB:mig, 1xH200:mig; b: 1xH200:mig, 2xL4:whole")
    for _ in range(2):  # b stays the busier host after a's A100 slice: the choice is a real one
        allocate(alice, SliceRequest("whole", model="L4", host="b"))
    counts = {}
    for model, profile in (("A100-80GB", "1g.10gb"), ("H200", "1g.18gb")):  # on host a alone, on a or b
        with CaptureQueriesContext(connection) as queries:
            taken = allocate(alice, SliceRequest("mig", profile, model=model), rule=first_fit)
        counts[model] = len(queries)
    assert host_of(taken) == "b"
    assert counts["H200"] == counts["A100-80GB"], "choosing between hosts a and b added a statement"
