"""Render reconciliation per engine (issue 31): a chunk's container is looked for on its slice's host's Docker
engine (``PORTAL_DOCKER_ENGINES``). A chunk whose engine does not answer is left as it is (nobody said its
container was gone) and its slice is not released, while the same silence elsewhere puts a chunk back."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from sessions.gpus import holdings
from sessions.gpus.allocator import SliceRequest, allocate
from sessions.gpus.holders import Holder
from sessions.gpus.models import Slice
from sessions.render import recovery, services
from sessions.render.models import RenderChunk, RenderJob
from tests.factories import one_frame_a_chunk
from tests.gpus.conftest import use_fleet
from tests.helpers.processes import GONE_ENGINE

pytestmark = [pytest.mark.docker, pytest.mark.django_db]


def test_a_chunk_whose_engine_does_not_answer_is_left_rendering_and_one_elsewhere_is_put_back(
    docker_engine: str, quiet_render_queue: str, alice: User, settings, render_dir: Path
) -> None:  # type: ignore[no-untyped-def]
    use_fleet(settings, "near: 1xA100-80GB:whole; far: 1xA100-80GB:whole")
    settings.DOCKER_ENGINES = {"far": GONE_ENGINE}
    job = one_frame_a_chunk(alice, RenderJob.State.RENDERING, frames=2, max_slices=2)
    long_ago = timezone.now() - timedelta(minutes=10)
    on = {}
    for index, host in enumerate(("near", "far")):
        taken = allocate(alice, SliceRequest("whole", "", "A100-SXM4-80GB", host=host), holder=Holder.render(job.pk))
        on[host] = taken
        RenderChunk.objects.filter(job=job, index=index).update(
            state=RenderChunk.State.RENDERING, slice=taken, attempts=1, started_at=long_ago
        )

    counts = recovery.reconcile()

    assert counts["chunks_put_back"] == 1, counts
    assert RenderChunk.objects.get(job=job, slice=on["far"]).state == RenderChunk.State.RENDERING
    assert Slice.objects.get(pk=on["far"].pk).released_at is None, "nothing of far's is released on no word"
    near_chunk = RenderChunk.objects.get(job=job, index=0)
    assert (near_chunk.state, near_chunk.attempts) == (RenderChunk.State.PENDING, 1)
    assert Slice.objects.get(pk=on["near"].pk).released_at is not None


def test_a_job_stopped_while_its_hosts_engine_does_not_answer_still_gives_its_slice_back(
    docker_engine: str, quiet_render_queue: str, alice: User, settings, render_dir: Path
) -> None:  # type: ignore[no-untyped-def]
    """Its holding ends at its last proof of life: nobody is charged for a container nobody can see."""
    use_fleet(settings, "far: 1xA100-80GB:whole")
    settings.DOCKER_ENGINES = {"far": GONE_ENGINE}
    job = one_frame_a_chunk(alice, RenderJob.State.RENDERING, frames=1, max_slices=1)
    taken = allocate(alice, SliceRequest("whole", "", "A100-SXM4-80GB"), holder=Holder.render(job.pk))
    began = timezone.now() - timedelta(minutes=10)
    holdings.started(taken.pk, began)
    holdings.seen([taken.pk], at=began + timedelta(minutes=3))

    services.stop_and_release(job.pk, "render job ended")

    taken.refresh_from_db()
    assert taken.released_at is not None and taken.held_until == began + timedelta(minutes=3)
