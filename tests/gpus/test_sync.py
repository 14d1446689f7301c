"""GPU discovery from the command line and by the host's agent (``tests/gpus/test_orders.py`` runs the agent)."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command

from sessions.gpus.models import Gpu


def test_the_command_records_and_reports_the_simulated_fleet(db: None, settings) -> None:  # type: ignore[no-untyped-def]
    settings.GPU_BACKEND = "simulated"
    settings.SIMULATED_FLEET = "lab: 2xH200:mig, 1xL4:whole"
    from sessions.gpus.backends import get_backend

    get_backend.cache_clear()
    out = io.StringIO()
    call_command("sync_gpus", stdout=out)
    get_backend.cache_clear()
    assert "simulated host lab: 3 GPU(s)" in out.getvalue()
    assert Gpu.objects.filter(host__name="lab").count() == 3


@pytest.mark.django_db(transaction=True)
def test_discovery_reclaims_an_instance_whose_slice_was_never_committed(settings) -> None:  # type: ignore[no-untyped-def]
    """A driver keeps an instance it made even when the portal's transaction then rolls back (NVML does):
    discovery must destroy it, not adopt it as a static instance on a dynamic GPU and strand the room."""
    from django.contrib.auth.models import User

    from sessions.gpus.allocator import SliceRequest, allocate
    from sessions.gpus.backends import get_backend
    from sessions.gpus.catalog import model
    from sessions.gpus.models import GpuInstance, SimulatedGpuInstance
    from tests.gpus.conftest import use_fleet

    [gpu] = use_fleet(settings, "orphan: 1xH200:mig")
    h200 = model("H200-SXM5-141GB")
    # What is left when the driver made the instance and the transaction that was to record it never committed.
    get_backend().create_instance(gpu.uuid, h200.profile("3g.71gb"), 4)
    assert SimulatedGpuInstance.objects.filter(gpu_uuid=gpu.uuid).count() == 1
    use_fleet(settings, "orphan: 1xH200:mig")
    assert not SimulatedGpuInstance.objects.filter(gpu_uuid=gpu.uuid).exists()
    assert not GpuInstance.objects.filter(gpu=gpu).exists()
    gpu.refresh_from_db()
    assert (gpu.mig_policy, gpu.compute_used, gpu.memory_mask) == (Gpu.Policy.DYNAMIC, 0, 0)
    whole = allocate(User.objects.create_user("after"), SliceRequest("mig", "7g.141gb"))  # all of it is free again
    assert whole.gpu_id == gpu.pk


@pytest.mark.django_db(transaction=True)
def test_discovery_adopts_an_operators_instance_on_a_static_gpu(settings) -> None:  # type: ignore[no-untyped-def]
    from sessions.gpus.backends import get_backend
    from sessions.gpus.catalog import model
    from sessions.gpus.fleet import set_policy
    from sessions.gpus.models import GpuInstance
    from tests.gpus.conftest import use_fleet

    [gpu] = use_fleet(settings, "static: 1xH200:mig")
    set_policy(gpu.pk, Gpu.Policy.STATIC)
    get_backend().create_instance(gpu.uuid, model("H200-SXM5-141GB").profile("3g.71gb"), 4)  # made by hand
    use_fleet(settings, "static: 1xH200:mig")
    assert list(GpuInstance.objects.filter(gpu=gpu).values_list("profile", "origin")) == [
        ("3g.71gb", GpuInstance.Origin.LAYOUT)
    ]
