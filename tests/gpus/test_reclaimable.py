"""reclaimable(): which spot slice, once gone, would make room for a refused on-demand request, on each kind."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from sessions.gpus import fleet
from sessions.gpus.allocator import AllocationRefused, SliceRequest, allocate, reclaimable, release
from sessions.gpus.holders import Holder, HolderKind
from sessions.gpus.models import Gpu, Reclaim, Slice
from tests.gpus.conftest import FleetMaker

MIG, WHOLE, SHARED = Slice.Kind.MIG, Slice.Kind.WHOLE, Slice.Kind.SHARED
SPOT, ON_DEMAND = Slice.Market.SPOT, Slice.Market.ON_DEMAND
holders = iter(range(1, 10_000))


def take(owner: User, kind: str, profile: str = "", market: str = ON_DEMAND) -> Slice:
    return allocate(owner, SliceRequest(kind, profile, market=market), holder=Holder.notebook(next(holders)))


def refused(owner: User, request: SliceRequest) -> bool:
    try:
        release(allocate(owner, request).pk)
    except AllocationRefused as error:
        return error.code == "no_capacity"
    return False


@pytest.fixture
def one_h200(make_fleet: FleetMaker, many_slices: User) -> Gpu:
    return make_fleet("r: 1xH200:mig")[0]


def test_allocate_records_the_market_it_was_asked_for(one_h200: Gpu, many_slices: User) -> None:
    assert take(many_slices, MIG, "1g.18gb").market == ON_DEMAND
    assert take(many_slices, MIG, "1g.18gb", market=SPOT).market == SPOT
    with pytest.raises(AllocationRefused, match="Unknown market"):
        allocate(many_slices, SliceRequest(MIG, "1g.18gb", market="auction"))


def test_a_dynamic_mig_gpu_gives_up_the_spot_slice_whose_room_fits(one_h200: Gpu, many_slices: User) -> None:
    take(many_slices, MIG, "4g.71gb")
    spot = take(many_slices, MIG, "3g.71gb", market=SPOT)
    wanted = SliceRequest(MIG, "3g.71gb")
    assert refused(many_slices, wanted)
    assert reclaimable(wanted) == spot
    # The on-demand 4g stays whatever happens, so a 7g never fits: nothing to reclaim for it.
    assert reclaimable(SliceRequest(MIG, "7g.141gb")) is None


def test_the_youngest_spot_slice_goes_first(one_h200: Gpu, many_slices: User) -> None:
    spots = [take(many_slices, MIG, "1g.18gb", market=SPOT) for _ in range(2)]
    for _ in range(5):
        take(many_slices, MIG, "1g.18gb")
    Slice.objects.filter(pk=spots[0].pk).update(allocated_at=timezone.now() - timedelta(hours=1))
    wanted = SliceRequest(MIG, "1g.18gb")
    assert refused(many_slices, wanted)
    assert reclaimable(wanted) == spots[1]


def test_a_spot_slice_too_small_to_make_room_is_left_alone(one_h200: Gpu, many_slices: User) -> None:
    take(many_slices, MIG, "4g.71gb")
    take(many_slices, MIG, "2g.35gb")
    take(many_slices, MIG, "1g.18gb", market=SPOT)
    assert refused(many_slices, SliceRequest(MIG, "3g.71gb"))
    assert reclaimable(SliceRequest(MIG, "3g.71gb")) is None  # one compute slice freed, three needed


def test_an_on_demand_slice_is_never_reclaimed(one_h200: Gpu, many_slices: User) -> None:
    for _ in range(7):
        take(many_slices, MIG, "1g.18gb")
    assert refused(many_slices, SliceRequest(MIG, "1g.18gb"))
    assert reclaimable(SliceRequest(MIG, "1g.18gb")) is None


def test_a_spot_slice_already_promised_is_not_promised_again(one_h200: Gpu, many_slices: User) -> None:
    spot = take(many_slices, MIG, "7g.141gb", market=SPOT)
    now = timezone.now()
    Reclaim.objects.create(
        slice=spot,
        waiting_kind=HolderKind.NOTEBOOK,
        waiting_id=999,
        owner=many_slices,
        request_kind=MIG,
        request_profile="7g.141gb",
        noticed_at=now,
        due_at=now,
    )
    assert reclaimable(SliceRequest(MIG, "7g.141gb")) is None
    Reclaim.objects.update(state=Reclaim.State.CANCELLED)
    assert reclaimable(SliceRequest(MIG, "7g.141gb")) == spot


def test_a_render_jobs_spot_slice_is_reclaimed_like_a_sessions(one_h200: Gpu, many_slices: User) -> None:
    """Every kind of workload gives its spot slices up the same way (through the workload registry)."""
    taken = allocate(many_slices, SliceRequest(MIG, "7g.141gb", market=SPOT), holder=Holder.render(1))
    assert reclaimable(SliceRequest(MIG, "7g.141gb")) == taken


def test_a_static_layout_gives_up_a_spot_instance_of_the_requested_profile(one_h200: Gpu, many_slices: User) -> None:
    fleet.set_policy(one_h200.pk, Gpu.Policy.STATIC)
    fleet.set_layout(one_h200.pk, [("3g.71gb", 4), ("4g.71gb", 0)])
    take(many_slices, MIG, "4g.71gb", market=SPOT)
    spot_3g = take(many_slices, MIG, "3g.71gb", market=SPOT)
    assert refused(many_slices, SliceRequest(MIG, "3g.71gb"))
    assert reclaimable(SliceRequest(MIG, "3g.71gb")) == spot_3g
    # Freeing the 4g would not give a 2g anywhere: a static layout keeps its instances.
    assert reclaimable(SliceRequest(MIG, "2g.35gb")) is None


def test_a_whole_gpu_held_on_spot_is_reclaimed_for_a_whole_gpu(make_fleet: FleetMaker, many_slices: User) -> None:
    make_fleet("w: 1xL4:whole")
    spot = take(many_slices, WHOLE, market=SPOT)
    assert refused(many_slices, SliceRequest(WHOLE))
    assert reclaimable(SliceRequest(WHOLE)) == spot
    assert reclaimable(SliceRequest(MIG, "1g.18gb")) is None  # another kind of slice: no room made for it


def test_a_whole_gpu_held_on_demand_is_not(make_fleet: FleetMaker, many_slices: User) -> None:
    make_fleet("w: 1xL4:whole")
    take(many_slices, WHOLE)
    assert reclaimable(SliceRequest(WHOLE)) is None


def test_a_share_on_a_full_time_sliced_gpu_is_reclaimed(make_fleet: FleetMaker, many_slices: User) -> None:
    make_fleet("s: 1xA30:shared=2")
    take(many_slices, SHARED)
    spot = take(many_slices, SHARED, market=SPOT)
    assert refused(many_slices, SliceRequest(SHARED))
    assert reclaimable(SliceRequest(SHARED)) == spot


def test_on_a_time_sliced_gpu_with_room_nothing_is_reclaimed(make_fleet: FleetMaker, many_slices: User) -> None:
    make_fleet("s: 1xA30:shared=3")
    take(many_slices, SHARED, market=SPOT)
    assert reclaimable(SliceRequest(SHARED)) is None
