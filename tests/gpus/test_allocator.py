"""allocate() and release(): MIG slices, whole GPUs, time-sliced shares, limits and refusals."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from sessions.gpus import fleet, placement
from sessions.gpus.allocator import AllocationRefused, ReleaseRefused, SliceRequest, allocate, release
from sessions.gpus.capacity import free_capacity, gpu_capacity
from sessions.gpus.holders import Holder
from sessions.gpus.models import Gpu, GpuInstance, SimulatedGpuInstance, Slice, SliceQuota
from tests.gpus import checker
from tests.gpus.conftest import FleetMaker

H200 = "H200-SXM5-141GB"
MIG = Slice.Kind.MIG


def mig(profile: str, **kwargs: str) -> SliceRequest:
    return SliceRequest(kind=MIG, profile=profile, **kwargs)


def test_a_mig_slice_gets_its_own_mig_device(h200s: list[Gpu], many_slices: User) -> None:
    taken = allocate(many_slices, mig("3g.71gb"), holder=Holder.notebook(1))
    assert taken.device_uuid.startswith("MIG-")
    assert taken.gpu.model_name == H200
    assert (taken.placement_start, taken.placement_size, taken.compute_slices) in {(0, 4, 3), (4, 4, 3)}
    assert SimulatedGpuInstance.objects.get(device_uuid=taken.device_uuid).profile == "3g.71gb"
    assert taken.holder == Holder.notebook(1)
    assert checker.problems() == []


def test_small_slices_fill_one_gpu_before_starting_another(h200s: list[Gpu], many_slices: User) -> None:
    first = allocate(many_slices, mig("1g.18gb"))
    second = allocate(many_slices, mig("1g.18gb"))
    assert first.gpu_id == second.gpu_id
    assert allocate(many_slices, mig("7g.141gb")).gpu_id != first.gpu_id


def test_under_a_small_heavy_demand_a_small_slice_does_not_take_memory_slice_zero(
    h200s: list[Gpu], many_slices: User
) -> None:
    value_rule = placement.choose  # the value rule under the prior: the portal's once it trusts such a demand
    taken = allocate(many_slices, mig("1g.18gb"), rule=value_rule)
    assert taken.placement_start != 0
    assert allocate(many_slices, mig("4g.71gb"), rule=value_rule).gpu_id == taken.gpu_id


def test_with_no_history_a_slice_is_placed_first_fit(h200s: list[Gpu], many_slices: User) -> None:
    assert allocate(many_slices, mig("1g.18gb")).placement_start == 0


def test_release_frees_exactly_what_was_taken(h200s: list[Gpu], many_slices: User) -> None:
    gpu = h200s[0]
    before = Gpu.objects.get(pk=gpu.pk).layout()
    taken = allocate(many_slices, mig("2g.35gb", host="sim-1"))
    release(taken.pk)
    taken.refresh_from_db()
    assert taken.released_at is not None
    assert Gpu.objects.get(pk=taken.gpu_id).layout() == before
    assert not GpuInstance.objects.filter(device_uuid=taken.device_uuid).exists()
    assert not SimulatedGpuInstance.objects.filter(device_uuid=taken.device_uuid).exists()


def test_a_whole_gpu_is_exclusive_and_gets_the_gpu_uuid(h200s: list[Gpu], many_slices: User, bob: User) -> None:
    taken = allocate(many_slices, SliceRequest(kind=Slice.Kind.WHOLE))
    assert taken.device_uuid == taken.gpu.uuid
    assert taken.device_uuid.startswith("GPU-")
    with pytest.raises(AllocationRefused, match="No whole GPU is free now"):
        allocate(bob, SliceRequest(kind=Slice.Kind.WHOLE))


def test_a_shared_gpu_takes_up_to_its_limit(h200s: list[Gpu], many_slices: User) -> None:
    shares = [allocate(many_slices, SliceRequest(kind=Slice.Kind.SHARED)) for _ in range(3)]
    assert {s.device_uuid for s in shares} == {shares[0].gpu.uuid}
    with pytest.raises(AllocationRefused, match="No time-sliced share is free now"):
        allocate(many_slices, SliceRequest(kind=Slice.Kind.SHARED))
    release(shares[0].pk)
    assert allocate(many_slices, SliceRequest(kind=Slice.Kind.SHARED)).gpu_id == shares[0].gpu_id


def test_the_per_user_limit_refuses_at_once(h200s: list[Gpu], alice: User, settings) -> None:  # type: ignore[no-untyped-def]
    settings.MAX_SLICES_PER_USER = 2
    allocate(alice, mig("1g.18gb"))
    allocate(alice, mig("1g.18gb"))
    with pytest.raises(AllocationRefused) as refused:
        allocate(alice, mig("1g.18gb"))
    assert refused.value.code == "quota"
    assert Slice.objects.filter(owner=alice).count() == 2


def test_a_quota_row_overrides_the_default_limit(h200s: list[Gpu], alice: User) -> None:
    SliceQuota.objects.create(user=alice, max_slices=0)
    with pytest.raises(AllocationRefused, match="your limit"):
        allocate(alice, mig("1g.18gb"))


def test_a_profile_the_model_lacks_is_refused_clearly(h200s: list[Gpu], alice: User) -> None:
    with pytest.raises(AllocationRefused, match="No MIG GPU on H200-SXM5-141GB has the profile '1g.10gb'") as refused:
        allocate(alice, mig("1g.10gb", model=H200))
    assert refused.value.code == "unknown_profile"
    with pytest.raises(AllocationRefused, match="No MIG GPU in the fleet has the profile 'banana'"):
        allocate(alice, mig("banana"))
    assert not Slice.objects.exists()


def test_a_request_names_models_as_the_fleet_setting_does_and_unknown_names_are_told_apart(
    make_fleet: FleetMaker, many_slices: User
) -> None:
    make_fleet("sim-1: 1xH200:mig, 1xA30:shared=2")
    assert allocate(many_slices, mig("1g.18gb", model="H200")).gpu.model_name == H200
    assert allocate(many_slices, SliceRequest(kind=Slice.Kind.SHARED, model="A30")).gpu.model_name == "A30-24GB"
    with pytest.raises(AllocationRefused, match="There is no GPU model 'H201'; try one of ") as refused:
        allocate(many_slices, mig("1g.18gb", model="H201"))
    assert refused.value.code == "unknown_model"
    with pytest.raises(AllocationRefused, match="There is no GPU host named 'sim-9'") as refused:
        allocate(many_slices, mig("1g.18gb", host="sim-9"))
    assert refused.value.code == "unknown_host"
    assert Slice.objects.filter(owner=many_slices).count() == 2


def test_a_kind_of_gpu_the_fleet_does_not_offer_is_refused_as_unavailable_not_busy(
    make_fleet: FleetMaker, many_slices: User
) -> None:
    make_fleet("sim-1: 1xH200:mig, 1xA30:shared=2")
    with pytest.raises(AllocationRefused) as refused:
        allocate(many_slices, SliceRequest(kind=Slice.Kind.WHOLE))
    assert refused.value.code == "unavailable"
    assert refused.value.reason == "No GPU in the fleet is offered as a whole GPU."
    with pytest.raises(AllocationRefused) as refused:
        allocate(many_slices, SliceRequest(kind=Slice.Kind.SHARED, model="H200"))
    assert refused.value.code == "unavailable"
    assert refused.value.reason == f"No GPU of {H200} in the fleet is offered as a time-sliced share."
    assert not Slice.objects.exists()


def test_no_capacity_says_what_is_free(h200s: list[Gpu], many_slices: User) -> None:
    allocate(many_slices, mig("7g.141gb"))
    allocate(many_slices, mig("4g.71gb"))
    with pytest.raises(AllocationRefused) as refused:
        allocate(many_slices, mig("7g.141gb"))
    assert refused.value.code == "no_capacity"
    assert "No 7g.141gb slice is free now" in refused.value.reason
    assert "H200-SXM5-141GB 3g.71gb ×1" in refused.value.reason
    assert refused.value.free[f"{H200} 1g.18gb"] == 3


def test_releasing_a_slice_that_does_not_exist_is_refused(h200s: list[Gpu], alice: User) -> None:
    """Who may release whose slice is sessions.access's rule (tests/notebooks/test_access.py); the allocator
    refuses what is not there."""
    taken = allocate(alice, mig("1g.18gb"))
    with pytest.raises(ReleaseRefused, match=f"no slice {taken.pk + 1}"):
        release(taken.pk + 1)
    taken.refresh_from_db()
    assert taken.active


def test_a_second_release_is_refused_and_changes_nothing(h200s: list[Gpu], alice: User) -> None:
    taken = allocate(alice, mig("1g.18gb"))
    release(taken.pk)
    layout = Gpu.objects.get(pk=taken.gpu_id).layout()
    with pytest.raises(ReleaseRefused, match="already released"):
        release(taken.pk)
    assert Gpu.objects.get(pk=taken.gpu_id).layout() == layout


def test_a_slice_whose_instance_the_driver_lost_is_still_released(h200s: list[Gpu], alice: User) -> None:
    """A GPU reset or a hand on the host can take an instance away; the slice must not stay held for ever."""
    taken = allocate(alice, mig("3g.71gb"))
    SimulatedGpuInstance.objects.filter(device_uuid=taken.device_uuid).delete()
    release(taken.pk)
    taken.refresh_from_db()
    assert not taken.active
    assert Gpu.objects.get(pk=taken.gpu_id).layout().compute_used == 0
    assert not GpuInstance.objects.filter(device_uuid=taken.device_uuid).exists()
    assert checker.problems() == []


def test_a_static_layout_hands_out_its_existing_instances(h200s: list[Gpu], many_slices: User) -> None:
    gpu = h200s[0]
    fleet.set_policy(gpu.pk, Gpu.Policy.STATIC)
    fleet.set_layout(gpu.pk, [("3g.71gb", 4), ("2g.35gb", 0), ("1g.18gb", 2), ("1g.18gb", 3)])
    fleet.set_policy(h200s[1].pk, Gpu.Policy.STATIC)
    existing = set(GpuInstance.objects.filter(gpu=gpu).values_list("device_uuid", flat=True))
    taken = allocate(many_slices, mig("1g.18gb"))
    assert taken.device_uuid in existing
    second = allocate(many_slices, mig("1g.18gb"))
    assert second.device_uuid in existing - {taken.device_uuid}
    with pytest.raises(AllocationRefused):
        allocate(many_slices, mig("1g.18gb"))
    release(taken.pk)
    assert GpuInstance.objects.filter(device_uuid=taken.device_uuid).exists()
    assert allocate(many_slices, mig("1g.18gb")).device_uuid == taken.device_uuid


def test_free_capacity_counts_each_profile_alone(h200s: list[Gpu], many_slices: User) -> None:
    taken = allocate(many_slices, mig("3g.71gb"), rule=placement.choose)
    assert taken.placement_start == 4  # the value rule keeps slices 0-3 whole for a 4g
    free = free_capacity(H200)
    assert free[f"{H200} 7g.141gb"] == 1
    assert free[f"{H200} 4g.71gb"] == 2
    assert free[f"{H200} 3g.71gb"] == 3
    assert free[f"{H200} 1g.18gb"] == 7 + 4


def test_static_capacity_ignores_whole_and_shared_slices_elsewhere(h200s: list[Gpu], many_slices: User) -> None:
    gpu = h200s[0]
    fleet.set_policy(gpu.pk, Gpu.Policy.STATIC)
    fleet.set_layout(gpu.pk, [("3g.71gb", 0), ("3g.71gb", 4)])
    allocate(many_slices, SliceRequest(kind=Slice.Kind.SHARED))
    allocate(many_slices, SliceRequest(kind=Slice.Kind.WHOLE))
    assert gpu_capacity(Gpu.objects.get(pk=gpu.pk))["3g.71gb"] == 2


def test_the_database_refuses_a_holder_without_an_id_or_an_end_before_the_start(
    h200s: list[Gpu], many_slices: User
) -> None:
    from datetime import timedelta

    from django.db import IntegrityError, transaction
    from django.utils import timezone

    taken = allocate(many_slices, mig("1g.18gb"), holder=Holder.render(3))
    now = timezone.now()
    for bad in ({"holder_id": None}, {"held_until": now}, {"held_from": now, "held_until": now - timedelta(seconds=1)}):
        with pytest.raises(IntegrityError), transaction.atomic():
            Slice.objects.filter(pk=taken.pk).update(**bad)
    Slice.objects.filter(pk=taken.pk).update(held_from=now, held_until=now)  # a holder that ran for no time at all


def test_the_database_spells_a_holder_as_its_text_does(h200s: list[Gpu], many_slices: User) -> None:
    """The metrics history keeps a holder as text; reports match it with the database's spelling."""
    from django.db.models import F

    from sessions.gpus import holders

    for holder in (Holder.render(3), Holder.notebook(1234)):
        taken = allocate(many_slices, mig("1g.18gb"), holder=holder)
        spelled = Slice.objects.filter(pk=taken.pk).values_list(
            holders.as_text(F("holder_kind"), F("holder_id")), flat=True
        )
        assert list(spelled) == [str(holder)]


def test_the_fleets_free_room_is_counted_in_the_same_queries_for_one_static_gpu_and_for_six(
    make_fleet: FleetMaker, many_slices: User
) -> None:
    """The launch form and a refusal's words count every GPU's room: static GPUs' free instances in one query."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from sessions.gpus.offers import offers

    gpus = make_fleet("q: 6xH200:mig")
    counted: list[int] = []
    for static in (gpus[:1], gpus[1:]):
        for gpu in static:
            fleet.set_policy(gpu.pk, Gpu.Policy.STATIC)
            fleet.set_layout(gpu.pk, [("3g.71gb", 0), ("3g.71gb", 4)])
        if len(counted) == 0:
            allocate(many_slices, mig("3g.71gb"))  # one of the first static GPU's instances is busy
        with CaptureQueriesContext(connection) as queries:
            free = free_capacity(H200)
            listed = {offer.key: offer.free for offer in offers(None)}
        assert free[f"{H200} 3g.71gb"] == listed[f"mig:{H200}:3g.71gb"] == 11  # 1 + 5 * 2 room, then 6 * 2 - 1
        counted.append(len(queries))
    assert counted[0] == counted[1]


def test_the_launch_paths_statements_reach_djangos_query_log_and_are_prepared_on_postgresql(
    h200s: list[Gpu], many_slices: User
) -> None:
    """The hot path's plain statements go through Django's cursor (query counting and execute wrappers see them);
    on PostgreSQL psycopg prepares them once they repeat, instead of planning each launch's anew."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as queries:
        for _ in range(6):
            release(allocate(many_slices, mig("1g.18gb")).pk)
    logged = [query["sql"] for query in queries.captured_queries]
    claims = [sql for sql in logged if "UPDATE gpus_gpu SET memory_mask" in sql]
    assert len(claims) == 12  # six claims and six releases of the layout (a release writes it all in one)
    assert sum("INSERT INTO gpus_slice" in sql for sql in logged) == 6  # with its order for the agent
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT statement FROM pg_prepared_statements")
            prepared = [row[0] for row in cursor.fetchall()]
        assert any(sql.startswith("UPDATE gpus_gpu SET memory_mask") for sql in prepared)
        assert any(sql.startswith("SELECT model_name, mig_policy, layout_key") for sql in prepared)
