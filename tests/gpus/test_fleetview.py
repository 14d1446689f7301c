"""The allocator's own transactions and its in-memory view of the fleet (PostgreSQL).

Both only come into play outside any enclosing transaction, so these tests
commit for real (``transaction=True``), as the portal's processes do.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import pytest
from django.contrib.auth.models import User
from django.db import connection, connections, transaction

from sessions.gpus import catalog, fleetview, placement, sql
from sessions.gpus.allocator import AllocationRefused, SliceRequest, _groups, _guess, allocate, release
from sessions.gpus.backends import get_backend
from sessions.gpus.backends.base import BackendError
from sessions.gpus.models import Gpu, GpuInstance, SimulatedGpuInstance, Slice, SliceQuota
from sessions.gpus.placement import Layout, why_not
from tests.gpus import checker
from tests.gpus.conftest import use_fleet

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif("connection.vendor != 'postgresql'", reason="the allocator's own transactions need PostgreSQL"),
]
H200 = catalog.model("H200-SXM5-141GB")
PROFILES = [profile.name for profile in H200.profiles]


@pytest.fixture
def fleet_and_user(settings) -> Iterator[tuple[list[Gpu], User]]:  # type: ignore[no-untyped-def]
    gpus = use_fleet(settings, "view: 3xH200:mig")
    user = User.objects.create_user("viewer")
    SliceQuota.objects.create(user=user, max_slices=100)
    fleetview.current().forget()
    yield gpus, user
    fleetview.current().forget()


def look(view: fleetview.FleetView) -> None:
    view.apply(sql.one(*view.statement()))


def assert_view_matches_the_database(view: fleetview.FleetView) -> None:
    for name in PROFILES:
        profile = H200.profile(name)
        assert view.layouts(H200, profile) == sql.one(*_groups(SliceRequest("mig", name), H200, profile)), name


def test_the_view_follows_every_allocation_and_release(fleet_and_user: tuple[list[Gpu], User]) -> None:
    _, user = fleet_and_user
    view = fleetview.current()
    held = []
    for number, name in enumerate(["1g.18gb", "2g.35gb", "3g.71gb", "1g.18gb", "4g.71gb", "1g.35gb", "7g.141gb"]):
        with contextlib.suppress(AllocationRefused):
            held.append(allocate(user, SliceRequest("mig", name)))
        if number % 3 == 2:
            release(held.pop(0).pk)
        look(view)
        assert_view_matches_the_database(view)
    assert checker.problems() == []


def test_a_change_committed_after_the_view_looked_is_read_on_the_next_look(
    fleet_and_user: tuple[list[Gpu], User],
) -> None:
    gpus, _ = fleet_and_user
    view = fleetview.current()
    look(view)
    other = gpus[1]
    changed = Layout().with_instance(H200.profile("3g.71gb"), 4)
    written, go_on, finished = threading.Event(), threading.Event(), threading.Event()

    def writer() -> None:
        # Another connection changes a GPU and keeps its transaction open while we look.
        try:
            with transaction.atomic():
                Gpu.objects.filter(pk=other.pk).update(
                    memory_mask=changed.memory_mask,
                    compute_used=changed.compute_used,
                    profile_counts=dict(changed.counts),
                    layout_key=changed.key,
                )
                written.set()
                go_on.wait(10)
        finally:
            connections.close_all()
            finished.set()

    thread = threading.Thread(target=writer)
    thread.start()
    assert written.wait(10)
    look(view)  # the change is not committed yet: not seen, and the view must not skip it later
    assert changed.key not in {key for _, key, _ in view.layouts(H200, H200.profile("1g.18gb"))}
    go_on.set()
    assert finished.wait(10)
    thread.join()
    look(view)
    assert changed.key in {key for _, key, _ in view.layouts(H200, H200.profile("1g.18gb"))}
    assert_view_matches_the_database(view)


def test_a_gpu_deleted_behind_the_views_back_costs_a_retry_not_a_refusal(
    fleet_and_user: tuple[list[Gpu], User],
) -> None:
    gpus, user = fleet_and_user
    view = fleetview.current()
    # A GPU with an attractive, nearly full layout: the rule would pick it first.
    bait = Layout().with_instance(H200.profile("4g.71gb"), 0).with_instance(H200.profile("2g.35gb"), 4)
    Gpu.objects.filter(pk=gpus[2].pk).update(
        memory_mask=bait.memory_mask,
        compute_used=bait.compute_used,
        profile_counts=dict(bait.counts),
        layout_key=bait.key,
    )
    look(view)
    assert bait.key in {key for _, key, _ in view.layouts(H200, H200.profile("1g.18gb"))}
    Gpu.objects.filter(pk=gpus[2].pk).delete()  # deletions leave no stamp: the view still has it
    taken = allocate(user, SliceRequest("mig", "1g.18gb"))
    assert taken.gpu_id in {gpus[0].pk, gpus[1].pk}
    look(view)  # the failed claim made this a full look: the deleted GPU is gone from the view
    assert bait.key not in {key for _, key, _ in view.layouts(H200, H200.profile("1g.18gb"))}
    assert_view_matches_the_database(view)


def test_a_driver_refusal_undoes_the_whole_allocation(fleet_and_user: tuple[list[Gpu], User]) -> None:
    gpus, user = fleet_and_user
    # The simulated driver already has instances the portal does not know of, everywhere a
    # 7g could go: the allocator picks a GPU, the driver refuses, and nothing may remain.
    for gpu in gpus:
        SimulatedGpuInstance.objects.create(
            gpu_uuid=gpu.uuid, gi_id=9, profile="1g.18gb", start=6, size=1, device_uuid=f"MIG-stray-{gpu.pk}"
        )
    with pytest.raises(AllocationRefused) as refused:
        allocate(user, SliceRequest("mig", "7g.141gb"))
    assert refused.value.code == "backend"
    assert not Slice.objects.exists()
    assert not GpuInstance.objects.exists()
    assert [g.layout_key for g in Gpu.objects.filter(pk__in=[g.pk for g in gpus])] == [Layout().key] * 3
    assert SimulatedGpuInstance.objects.count() == 3
    assert connection.get_autocommit() and not connection.needs_rollback
    assert allocate(user, SliceRequest("mig", "1g.18gb")).device_uuid.startswith("MIG-")


def test_orm_work_inside_the_allocators_transaction_belongs_to_it(fleet_and_user: tuple[list[Gpu], User]) -> None:
    gpus, _ = fleet_and_user
    with pytest.raises(RuntimeError, match="on purpose"), sql.transaction():
        assert sql.manual()
        locked = Gpu.objects.select_for_update().get(pk=gpus[0].pk)  # needs a transaction: it has one
        User.objects.create_user("inside")
        with transaction.atomic():  # nested: a savepoint, never a commit of ours
            User.objects.create_user("nested")
        assert locked.pk == gpus[0].pk
        raise RuntimeError("on purpose")
    assert not User.objects.filter(username__in=["inside", "nested"]).exists()
    with sql.transaction():
        User.objects.create_user("kept")
        sql.batch(("SELECT 1", []), commit=True)
        with pytest.raises(RuntimeError, match="after this transaction's COMMIT"):
            User.objects.get(username="kept")
    assert User.objects.filter(username="kept").exists()
    assert connection.get_autocommit()


def test_the_simulated_driver_refuses_what_fits_in_memory_but_not_in_compute(
    fleet_and_user: tuple[list[Gpu], User],
) -> None:
    """The driver's insert only refuses overlaps; the other rules are checked beside it and undone."""
    gpus, _ = fleet_and_user
    backend = get_backend()
    found = next(
        (first, start, second, other)
        for first in H200.profiles
        for start in first.placements
        for second in H200.profiles
        for other in second.placements
        if not Layout().with_instance(first, start).memory_mask & second.mask_at(other)
        and why_not(H200, Layout().with_instance(first, start), second, other)
    )
    first, start, second, other = found
    backend.create_instance(gpus[0].uuid, first, start)
    with pytest.raises(BackendError) as refused:
        backend.create_instance(gpus[0].uuid, second, other)
    assert refused.value.code == "insufficient_resources"
    assert list(SimulatedGpuInstance.objects.filter(gpu_uuid=gpus[0].uuid).values_list("profile", "start")) == [
        (first.name, start)
    ]


def db_layouts(gpus: list[Gpu]) -> dict[int, str]:
    return dict(Gpu.objects.filter(pk__in=[gpu.pk for gpu in gpus]).values_list("pk", "layout_key"))


def test_the_view_holds_our_own_commits_before_any_look(fleet_and_user: tuple[list[Gpu], User]) -> None:
    gpus, user = fleet_and_user
    view = fleetview.current()
    look(view)
    taken = allocate(user, SliceRequest("mig", "3g.71gb"))
    # Our commit is in the view at once, without a look.
    assert view.gpus[taken.gpu_id][2] == db_layouts(gpus)[taken.gpu_id] != Layout().key
    release(taken.pk)
    assert view.gpus[taken.gpu_id][2] == db_layouts(gpus)[taken.gpu_id] == Layout().key
    with transaction.atomic():  # someone else's transaction: nothing is noted, it could still roll back
        inside = allocate(user, SliceRequest("mig", "2g.35gb"))
        assert view.gpus[inside.gpu_id][2] == Layout().key != db_layouts(gpus)[inside.gpu_id]
    look(view)
    assert_view_matches_the_database(view)
    assert checker.problems() == []


def test_a_guess_whose_layout_is_gone_takes_nothing_and_the_request_goes_the_long_way(
    fleet_and_user: tuple[list[Gpu], User],
) -> None:
    gpus, user = fleet_and_user
    view = fleetview.current()
    first = allocate(user, SliceRequest("mig", "3g.71gb"))
    look(view)
    # The view would now send a 1g to the fullest GPU, the only one with this layout...
    guessed = _guess(view, [H200], "1g.18gb", placement.choose)
    assert guessed is not None and guessed[2].key == db_layouts(gpus)[first.gpu_id]
    other: list[Slice] = []

    def elsewhere() -> None:  # ...but another thread, with its own view, places there first.
        try:
            other.append(allocate(User.objects.create_user("other"), SliceRequest("mig", "1g.18gb")))
        finally:
            connections.close_all()

    thread = threading.Thread(target=elsewhere)
    thread.start()
    thread.join()
    assert other[0].gpu_id == first.gpu_id
    assert view.gpus[first.gpu_id][2] == guessed[2].key  # our view has not looked since
    fresh = [
        (key, Layout.from_key(key))
        for _, key, _ in sql.one(*_groups(SliceRequest("mig"), H200, H200.profile("1g.18gb")))
    ]
    chosen = placement.choose(H200, fresh, H200.profile("1g.18gb"))
    assert chosen is not None
    expected_key, expected_start = chosen
    taken = allocate(user, SliceRequest("mig", "1g.18gb"))
    # The claim for the guess found no GPU with that layout; the slice went where a fresh look says.
    assert (
        db_layouts(gpus)[taken.gpu_id]
        == Layout.from_key(expected_key).with_instance(H200.profile("1g.18gb"), expected_start).key
    )
    assert taken.placement_start == expected_start
    assert checker.problems() == []
    assert_view_matches_the_database(view)


def test_a_refused_request_undoes_the_claim_its_guess_made(fleet_and_user: tuple[list[Gpu], User]) -> None:
    gpus, user = fleet_and_user
    SliceQuota.objects.filter(user=user).update(max_slices=1)
    view = fleetview.current()
    held = allocate(user, SliceRequest("mig", "1g.18gb"))
    before = db_layouts(gpus)
    assert _guess(view, [H200], "1g.18gb", placement.choose) is not None  # a claim rides along...
    with pytest.raises(AllocationRefused) as refused:
        allocate(user, SliceRequest("mig", "1g.18gb"))
    assert refused.value.code == "quota"  # ...and is undone with the refusal
    assert db_layouts(gpus) == before
    assert list(Slice.objects.values_list("pk", flat=True)) == [held.pk]
    assert GpuInstance.objects.count() == SimulatedGpuInstance.objects.count() == 1
    assert {gpu_id: entry[2] for gpu_id, entry in view.gpus.items()} == before
    assert checker.problems() == []
