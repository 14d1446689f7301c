"""GPU discovery from the command line and from the Celery worker."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command

from sessions.gpus.models import Gpu
from sessions.gpus.tasks import sync_gpus


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


@pytest.mark.celery
@pytest.mark.django_db(transaction=True)
def test_the_worker_rediscovers_gpus(celery_worker: str) -> None:
    assert sync_gpus.delay().get(timeout=60) == 4  # the default simulated fleet
    assert Gpu.objects.filter(host__name="sim-1", state=Gpu.State.OK).count() == 4
