"""The demand the placement rule weighs layouts by, learned from the MIG slices people were given."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from sessions.gpus import catalog, demand, placement
from sessions.gpus.allocator import SliceRequest, allocate, release
from sessions.gpus.models import Gpu, Slice
from sessions.gpus.placement import Layout
from tests.gpus.conftest import FleetMaker

H200 = catalog.model("H200-SXM5-141GB")
A100_40 = catalog.model("A100-SXM4-40GB")


@pytest.fixture(autouse=True)
def nothing_kept() -> Iterator[None]:
    # What one process keeps would outlive each test's rolled-back slices.
    demand.forget()
    yield
    demand.forget()


@pytest.fixture
def mixed_fleet(make_fleet: FleetMaker) -> list[Gpu]:
    return make_fleet("sim-1: 4xH200:mig, 1xA100-40GB:mig, 1xA100-80GB:whole")


def take(owner: User, names: list[str]) -> list[Slice]:
    return [allocate(owner, SliceRequest(kind=Slice.Kind.MIG, profile=name)) for name in names]


def test_with_no_slices_yet_there_is_no_demand_to_trust_and_a_launch_places_first_fit(
    mixed_fleet: list[Gpu], many_slices: User
) -> None:
    assert demand.requested(H200.name) == {}
    assert demand.for_model(H200.name) is None
    taken = take(many_slices, ["2g.35gb", "3g.71gb", "2g.35gb"])  # the prior's bet would refuse the third
    assert len({each.gpu_id for each in taken}) == 1
    assert [each.placement_start for each in taken] == [0, 4, 2]


def test_slices_given_on_a_model_are_counted_by_profile(mixed_fleet: list[Gpu], many_slices: User) -> None:
    taken = take(many_slices, ["2g.35gb", "3g.71gb", "2g.35gb", "1g.18gb", "3g.20gb"])
    release(taken[0].pk)  # asked for all the same
    allocate(many_slices, SliceRequest(kind=Slice.Kind.WHOLE))  # no MIG profile: says nothing about the mix
    assert demand.requested(H200.name) == {"2g.35gb": 2, "3g.71gb": 1, "1g.18gb": 1}
    assert demand.requested(A100_40.name) == {"3g.20gb": 1}


def test_the_demand_follows_what_people_ask_for_once_enough_was_asked(
    mixed_fleet: list[Gpu], many_slices: User
) -> None:
    rounds = placement.TRUSTED_REQUESTS // 4
    for number in range(rounds):
        release_all(many_slices, take(many_slices, ["2g.35gb", "3g.71gb", "2g.35gb", "3g.71gb"]))
        if number == rounds - 2:
            demand.forget()
            assert demand.for_model(H200.name) is None  # not yet: 4 requests short
    demand.forget()  # the allocator read the demand before these slices were given
    learned = demand.for_model(H200.name)
    prior = placement.prior(H200)
    assert learned == placement.learned(H200, {"2g.35gb": 2 * rounds, "3g.71gb": 2 * rounds})
    assert learned.share("3g.71gb") > 2 * prior.share("3g.71gb")
    assert demand.for_model(A100_40.name) is None  # nothing asked of the A100 yet


def test_slices_older_than_the_window_are_forgotten(mixed_fleet: list[Gpu], many_slices: User) -> None:
    old, _ = take(many_slices, ["3g.71gb", "2g.35gb"])
    Slice.objects.filter(pk=old.pk).update(allocated_at=timezone.now() - demand.WINDOW - timedelta(hours=1))
    assert demand.requested(H200.name) == {"2g.35gb": 1}
    assert demand.requested(H200.name, since=timezone.now() - demand.WINDOW * 2) == {"2g.35gb": 1, "3g.71gb": 1}


def test_a_process_keeps_the_demand_it_read_until_it_goes_stale(mixed_fleet: list[Gpu], many_slices: User) -> None:
    for _ in range(placement.TRUSTED_REQUESTS // 12):
        release_all(many_slices, take(many_slices, ["1g.18gb"] * 12))
    demand.forget()
    first = demand.for_model(H200.name)
    assert first is not None
    take(many_slices, ["3g.71gb"] * 2 + ["4g.71gb"] * 2)
    assert demand.for_model(H200.name) is first  # no query on the launch path until it is stale
    demand.forget()  # as if REFRESH_SECONDS had passed
    again = demand.for_model(H200.name)
    assert again is not None and again.share("3g.71gb") > first.share("3g.71gb")


def test_a_thin_history_is_read_again_within_seconds(mixed_fleet: list[Gpu]) -> None:
    assert demand.for_model(H200.name) is None
    assert demand.THIN_REFRESH_SECONDS < demand.REFRESH_SECONDS / 10


def test_after_2g_and_3g_requests_one_h200_takes_a_2g_a_3g_and_a_2g(mixed_fleet: list[Gpu], many_slices: User) -> None:
    # Issue 12's smallest case, with the demand learned from real slices as the allocator will read it.
    for _ in range(placement.TRUSTED_REQUESTS // 5 + 1):  # enough requests to trust their demand
        release_all(many_slices, take(many_slices, ["2g.35gb", "3g.71gb", "1g.18gb", "2g.35gb", "3g.71gb"]))
    demand.forget()  # the allocator read the demand before these slices were given
    learned = demand.for_model(H200.name)
    assert learned is not None
    layout = Layout()
    for name in ["2g.35gb", "3g.71gb", "2g.35gb"]:
        profile = H200.profile(name)
        choice = placement.choose(H200, [(0, layout)], profile, learned)
        assert choice is not None, f"{name} refused on {layout.key}"
        layout = layout.with_instance(profile, choice[1])
    assert layout.compute_used == 7


def release_all(owner: User, slices: list[Slice]) -> None:
    for each in slices:
        release(each.pk)


def test_the_demand_is_the_last_few_hundred_requests_so_a_changed_mix_is_followed(
    mixed_fleet: list[Gpu], many_slices: User
) -> None:
    for _ in range(placement.RECENT_REQUESTS // 20):
        release_all(many_slices, take(many_slices, ["1g.18gb"] * 20))
    for _ in range(50 // 5):  # the mix changes: 3g now
        release_all(many_slices, take(many_slices, ["3g.71gb"] * 5))
    counted = demand.requested(H200.name)
    assert counted == {"1g.18gb": placement.RECENT_REQUESTS - 50, "3g.71gb": 50}
