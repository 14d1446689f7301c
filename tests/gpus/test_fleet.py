"""Discovery into the database, operator changes, presets and the simulated-fleet setting."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from sessions.gpus import catalog, fleet, placement
from sessions.gpus.allocator import SliceRequest, allocate
from sessions.gpus.backends.simulated import FleetSpecError, parse_fleet
from sessions.gpus.models import Gpu, GpuHost, GpuInstance, SimulatedGpuInstance
from sessions.gpus.presets import parse_layout, presets
from tests.gpus.conftest import FleetMaker


def test_discovery_records_hosts_gpus_and_modes(make_fleet: FleetMaker) -> None:
    gpus = make_fleet("alpha: 2xH200:mig, 1xA30:shared=3; beta: 1xL4:whole")
    assert [g.host.name for g in gpus] == ["alpha", "alpha", "alpha", "beta"]
    assert [g.sharing for g in gpus] == ["mig", "mig", "shared", "whole"]
    assert gpus[2].share_limit == 3
    assert all(g.simulated and g.state == Gpu.State.OK for g in gpus)
    assert gpus[0].memory_gib == 141.0


def test_simulated_uuids_are_reproducible(make_fleet: FleetMaker) -> None:
    first = [g.uuid for g in make_fleet("alpha: 2xH200:mig")]
    again = [g.uuid for g in parse_fleet("alpha: 2xH200:mig")]
    assert first == again
    assert len(set(first)) == 2


def test_a_gpu_that_disappears_is_marked_missing(make_fleet: FleetMaker) -> None:
    gpus = make_fleet("alpha: 2xH200:mig")
    make_fleet("alpha: 1xH200:mig")
    assert Gpu.objects.get(pk=gpus[1].pk).state == Gpu.State.MISSING
    assert Gpu.objects.get(pk=gpus[0].pk).state == Gpu.State.OK


def test_resyncing_keeps_instances_and_bookkeeping(make_fleet: FleetMaker, alice: User) -> None:
    make_fleet("alpha: 1xH200:mig")
    taken = allocate(alice, SliceRequest(kind="mig", profile="2g.35gb"))
    layout = Gpu.objects.get(pk=taken.gpu_id).layout()
    make_fleet("alpha: 1xH200:mig")
    gpu = Gpu.objects.get(pk=taken.gpu_id)
    assert gpu.layout() == layout
    assert gpu.active_slices == 1
    assert GpuInstance.objects.filter(device_uuid=taken.device_uuid).exists()


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("2xH9000:mig", "Unknown GPU model 'H9000'"),
        ("2xL4:mig", "L4-24GB has no MIG"),
        ("two H200s", "is not COUNTxMODEL:MODE"),
        ("1xA30:shared=1", "2 to 64 sessions"),
        ("1xH200:whole=3", "only shared GPUs take a session limit"),
        ("0xH200:mig", "between 1 and 4096"),
        ("", "the simulated fleet is empty"),
    ],
)
def test_a_malformed_fleet_setting_says_what_is_wrong(spec: str, message: str) -> None:
    with pytest.raises(FleetSpecError, match=message):
        parse_fleet(spec)


@pytest.mark.parametrize("model", [m for m in catalog.models().values() if m.mig_capable], ids=lambda m: m.name)
def test_every_preset_is_a_legal_layout(model: catalog.GpuModel) -> None:
    named = presets(model)
    assert {"all-1g", "all-2g", "all-balanced"} <= set(named)
    for layout in named.values():
        placement.layout_of(model, layout)


def static_h200(make_fleet: FleetMaker) -> Gpu:
    gpu = make_fleet("alpha: 1xH200:mig")[0]
    return fleet.set_policy(gpu.pk, Gpu.Policy.STATIC)


def test_a_preset_layout_creates_its_instances(make_fleet: FleetMaker) -> None:
    gpu = static_h200(make_fleet)
    fleet.set_layout(gpu.pk, presets(gpu.catalog_model)["all-balanced"])
    made = sorted(GpuInstance.objects.filter(gpu=gpu).values_list("profile", "start"))
    assert made == [("1g.18gb", 2), ("1g.18gb", 3), ("2g.35gb", 0), ("3g.71gb", 4)]
    assert SimulatedGpuInstance.objects.filter(gpu_uuid=gpu.uuid).count() == 4
    assert Gpu.objects.get(pk=gpu.pk).compute_used == 7


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("3g.71gb@0, 2g.35gb@2", "needs memory slices 2-3, and some are taken"),
        ("3g.71gb@2", "cannot start at memory slice 2; it may start at 0, 4"),
        ("1g.18gb+me@0, 1g.18gb+me@1", r"holds at most 1 × 1g\.18gb\+me"),
        ("5g.99gb@0", "has no MIG profile '5g.99gb'"),
    ],
)
def test_an_illegal_layout_is_refused_saying_why_and_changes_nothing(
    make_fleet: FleetMaker, text: str, reason: str
) -> None:
    gpu = static_h200(make_fleet)
    fleet.set_layout(gpu.pk, [("7g.141gb", 0)])
    with pytest.raises(fleet.FleetChangeRefused, match=reason):
        fleet.set_layout(gpu.pk, parse_layout(text))
    assert list(GpuInstance.objects.filter(gpu=gpu).values_list("profile", flat=True)) == ["7g.141gb"]


def test_compute_slices_are_checked_apart_from_memory() -> None:
    model = catalog.model("H200-SXM5-141GB")
    crowded = placement.Layout(memory_mask=0, compute_used=7)
    assert placement.why_not(model, crowded, model.profile("1g.18gb"), 0) == (
        "1g.18gb needs 1 compute slices; only 0 are free."
    )
    assert placement.fit_count(model, crowded, model.profile("1g.18gb")) == 0


def test_a_layout_in_a_wrong_format_is_refused() -> None:
    with pytest.raises(ValueError, match="is not PROFILE@START"):
        parse_layout("3g.71gb at 4")


def test_changes_are_refused_while_a_slice_is_in_use(make_fleet: FleetMaker, alice: User) -> None:
    make_fleet("alpha: 1xH200:mig")
    taken = allocate(alice, SliceRequest(kind="mig", profile="1g.18gb"))
    with pytest.raises(fleet.FleetChangeRefused, match="in use"):
        fleet.set_policy(taken.gpu_id, Gpu.Policy.STATIC)
    assert Gpu.objects.get(pk=taken.gpu_id).mig_policy == Gpu.Policy.DYNAMIC


def test_a_layout_needs_the_static_policy(make_fleet: FleetMaker) -> None:
    gpu = make_fleet("alpha: 1xH200:mig")[0]
    with pytest.raises(fleet.FleetChangeRefused, match="switch the policy first"):
        fleet.set_layout(gpu.pk, [("7g.141gb", 0)])


def test_switching_back_to_dynamic_removes_the_layout(make_fleet: FleetMaker) -> None:
    gpu = static_h200(make_fleet)
    fleet.set_layout(gpu.pk, [("3g.71gb", 0), ("3g.71gb", 4)])
    fleet.set_policy(gpu.pk, Gpu.Policy.DYNAMIC)
    assert not GpuInstance.objects.filter(gpu=gpu).exists()
    assert not SimulatedGpuInstance.objects.filter(gpu_uuid=gpu.uuid).exists()
    assert Gpu.objects.get(pk=gpu.pk).layout() == placement.Layout()


def test_sharing_mode_cannot_contradict_the_mig_mode(make_fleet: FleetMaker) -> None:
    mig_gpu, shared = make_fleet("alpha: 1xH200:mig, 1xA30:shared=4")
    with pytest.raises(fleet.FleetChangeRefused, match="can only hand out MIG slices"):
        fleet.set_sharing(mig_gpu.pk, Gpu.Sharing.WHOLE)
    with pytest.raises(fleet.FleetChangeRefused, match="MIG mode is off"):
        fleet.set_sharing(shared.pk, Gpu.Sharing.MIG)
    assert fleet.set_sharing(shared.pk, Gpu.Sharing.WHOLE).sharing == Gpu.Sharing.WHOLE
    assert fleet.set_sharing(shared.pk, Gpu.Sharing.SHARED, 8).share_limit == 8


def test_hosts_remember_their_backend(make_fleet: FleetMaker) -> None:
    make_fleet("alpha: 1xL4:whole")
    host = GpuHost.objects.get(name="alpha")
    assert host.simulated and host.driver_version == "simulated" and host.last_seen is not None
