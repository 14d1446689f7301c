"""factory_boy factories shared by the tests."""

from __future__ import annotations

import secrets
from datetime import datetime
from typing import TYPE_CHECKING

import factory
from django.contrib.auth.models import Group, User

if TYPE_CHECKING:
    from sessions.gpus.allocator import SliceRequest
    from sessions.notebooks.models import NotebookImage, NotebookSession
    from sessions.render.models import RenderJob

PASSWORD = "correct horse battery staple"


class UserFactory(factory.django.DjangoModelFactory[User]):
    class Meta:
        model = User
        django_get_or_create = ("username",)
        skip_postgeneration_save = True

    username = factory.Sequence(lambda n: f"user{n}")
    email = factory.LazyAttribute(lambda user: f"{user.username}@example.org")
    password = factory.PostGenerationMethodCall("set_password", PASSWORD)

    @factory.post_generation
    def roles(self, create: bool, extracted: list[str] | None, **kwargs: object) -> None:
        if not create:
            return
        for name in ["users"] if extracted is None else extracted:
            self.groups.add(  # type: ignore[attr-defined]
                Group.objects.get_or_create(name=name)[0]
            )
        self.save()  # type: ignore[attr-defined]


def make_user(username: str, roles: list[str], **fields: object) -> User:
    user = UserFactory(username=username, roles=roles, **fields)
    assert isinstance(user, User)
    return user


def running_session(owner: User, image: NotebookImage, request: SliceRequest, name: str) -> NotebookSession:
    """A session that runs as far as the portal knows, set up without the hub or Celery.

    start_session() would enqueue a real start; with a Celery worker up and no hub
    that start fails and frees the slice, which is not what a metrics test is about.
    """
    from django.utils import timezone

    from sessions.gpus.allocator import allocate
    from sessions.gpus.holders import Holder
    from sessions.notebooks.models import NotebookSession

    now = timezone.now()
    session = NotebookSession.objects.create(
        owner=owner,
        server_name=name,
        image=image,
        state=NotebookSession.State.RUNNING,
        progress=100,
        container_started_at=now,
        ready_at=now,
    )
    session.slice = allocate(owner, request, holder=Holder.notebook(session.pk))
    session.save(update_fields=["slice"])
    return session


def session_minute(session: NotebookSession, minute: datetime, util: float, **figures: float) -> None:
    """One stored minute of GPU history for a session's slice, as the agent writes it."""
    from sessions.metrics.models import GpuMinute

    GpuMinute.objects.create(
        minute=minute,
        host="sim",
        gpu_uuid="GPU-test",
        device_uuid=session.slice.device_uuid if session.slice else "MIG-test",
        holder=f"notebook:{session.pk}",
        owner_id=session.owner_id,
        session_id=session.pk,
        samples=60,
        util_mean=util,
        util_max=util,
        **figures,
    )


def one_frame_a_chunk(owner: User, state: str, frames: int, max_slices: int, queued: bool = True) -> RenderJob:
    """A render job's rows on whole A100s, a chunk for each of its ``frames`` frames (and, once ``queued``, the
    frames' and chunks' rows confirmation writes); no scene: for tests of what the database alone decides."""
    from sessions.render.models import RenderChunk, RenderFrame, RenderJob

    numbers = list(range(1, frames + 1))
    job = RenderJob.objects.create(
        owner=owner,
        state=state,
        upload_name="shot.blend",
        folder=f"t{owner.pk}/{secrets.token_hex(8)}",
        main_file="scene.blend",
        frame_spec=f"1-{frames}",
        frames=numbers,
        frame_count=frames,
        chunk_size=1,
        max_slices=max_slices,
        gpu_kind="whole",
        gpu_model="A100-SXM4-80GB",
    )
    if queued:
        RenderFrame.objects.bulk_create([RenderFrame(job=job, number=n) for n in numbers])
        RenderChunk.objects.bulk_create([RenderChunk(job=job, index=n - 1, frames=[n]) for n in numbers])
    return job
