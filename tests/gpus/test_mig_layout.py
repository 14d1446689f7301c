"""A node whose MIG layout is the cluster's (issue 34): on Kubernetes, NVIDIA's mig-manager applies a layout from
the node's label, and the host's agent (PORTAL_MIG_LAYOUT=cluster) stands back: the instances it finds are its
GPUs' static layout, slices are handed out of them and leave them as they were, and nothing of the portal's
(an operator's layout, a policy switch, an order however it came) makes or removes one. On a host whose layout
is the portal's, the same unrecorded instance is reclaimed: the setting is what keeps mig-manager's."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from sessions.gpus import fleet, orders
from sessions.gpus.allocator import SliceRequest, allocate, release
from sessions.gpus.backends import get_backend
from sessions.gpus.catalog import model
from sessions.gpus.models import Gpu, GpuHost, GpuInstance, HostOrder, SimulatedGpuInstance
from sessions.gpus.requests import AllocationRefused
from tests.gpus.conftest import use_fleet

pytestmark = pytest.mark.django_db(transaction=True)
FLEET = "k8s-node: 1xH200:mig"
H200 = model("H200-SXM5-141GB")
LABELLED = [("3g.71gb", 0), ("2g.35gb", 4), ("1g.18gb", 6)]  # what mig-manager made from the node's label


def on_device(gpu: Gpu) -> list[tuple[str, int]]:
    return sorted(SimulatedGpuInstance.objects.filter(gpu_uuid=gpu.uuid).values_list("profile", "start"))


def labelled(settings, layout: str) -> Gpu:  # type: ignore[no-untyped-def]
    """The node's GPU as mig-manager left it, then discovered by an agent whose layout setting is ``layout``."""
    settings.MIG_LAYOUT = "portal"
    [gpu] = use_fleet(settings, FLEET)
    backend = get_backend()
    for profile, start in LABELLED:  # made outside the portal (this process may: it stands for the node)
        backend.create_instance(gpu.uuid, H200.profile(profile), start)
    settings.MIG_LAYOUT = layout
    fleet.sync_fleet()
    return Gpu.objects.select_related("host").get(pk=gpu.pk)


def test_the_agent_of_a_cluster_layout_takes_the_instances_it_finds_as_they_are(settings) -> None:  # type: ignore[no-untyped-def]
    gpu = labelled(settings, "cluster")
    assert gpu.host.mig_layout == GpuHost.MigLayout.CLUSTER and gpu.mig_policy == Gpu.Policy.STATIC
    assert on_device(gpu) == sorted(LABELLED), "none reclaimed"
    recorded = GpuInstance.objects.filter(gpu=gpu)
    assert sorted(recorded.values_list("profile", "start")) == sorted(LABELLED)
    assert set(recorded.values_list("origin", flat=True)) == {GpuInstance.Origin.LAYOUT}


def test_slices_come_out_of_the_cluster_layout_and_leave_it_as_it_was(settings) -> None:  # type: ignore[no-untyped-def]
    gpu = labelled(settings, "cluster")
    owner = User.objects.create_user("renderer")
    taken = allocate(owner, SliceRequest("mig", "2g.35gb"))
    instance = GpuInstance.objects.get(gpu=gpu, profile="2g.35gb")
    assert taken.device_uuid == instance.device_uuid and taken.gpu_id == gpu.pk
    assert not HostOrder.objects.filter(gpu=gpu).exists(), "no instance made for it"
    with pytest.raises(AllocationRefused):
        allocate(owner, SliceRequest("mig", "2g.35gb"))  # the layout's one 2g is taken; none is made
    with pytest.raises(AllocationRefused):
        allocate(owner, SliceRequest("mig", "4g.71gb"))  # a profile the layout lacks
    release(taken.pk)
    assert on_device(gpu) == sorted(LABELLED) and not HostOrder.objects.filter(gpu=gpu).exists()
    again = allocate(owner, SliceRequest("mig", "2g.35gb"))
    assert again.device_uuid == instance.device_uuid, "the same instance, handed out again"


def test_nothing_of_the_portals_changes_a_cluster_layout(settings) -> None:  # type: ignore[no-untyped-def]
    gpu = labelled(settings, "cluster")
    for change in (
        lambda: fleet.set_layout(gpu.pk, [("7g.141gb", 0)]),
        lambda: fleet.set_policy(gpu.pk, Gpu.Policy.DYNAMIC),
    ):
        with pytest.raises(fleet.FleetChangeRefused, match="MIG layout is its Kubernetes node's"):
            change()
    order = orders.apply_layout(gpu, [("7g.141gb", 0)])  # recorded however it came: its agent refuses it
    orders.carry_out(order.pk)
    order.refresh_from_db()
    assert order.state == HostOrder.State.FAILED and "the cluster's (PORTAL_MIG_LAYOUT=cluster)" in order.error
    assert on_device(gpu) == sorted(LABELLED)


def test_the_portals_own_layout_reclaims_an_instance_nobody_recorded(settings) -> None:  # type: ignore[no-untyped-def]
    gpu = labelled(settings, "portal")
    assert gpu.host.mig_layout == GpuHost.MigLayout.PORTAL and gpu.mig_policy == Gpu.Policy.DYNAMIC
    assert on_device(gpu) == [], "on a dynamic GPU an unrecorded instance is nobody's"
