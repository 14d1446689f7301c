"""Notebooks and the storage quota: a person's work volume is measured by the portal in a short container of
its own (read-only, no network), without following links, every file at least 4 KiB and a sparse one at its full
length, and a session container's writable layer as Docker reports it (SizeRw); both count toward the quota.
While a person's files fill their quota a launch is refused, saying what uses it, and each running session's
card warns (the session is not stopped: that would lose unsaved work)."""

from __future__ import annotations

import html
from collections.abc import Iterator

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse
from django.utils.html import strip_tags

from sessions.gpus.allocator import SliceRequest
from sessions.gpus.models import Slice
from sessions.notebooks import storage as notebook_storage
from sessions.notebooks.models import NotebookImage, NotebookSession, WorkVolume
from sessions.runtime.docker import DockerRuntime
from sessions.runtime.spec import INSTANCE_LABEL
from sessions.storage import tasks, usage
from sessions.storage.models import StorageUse
from tests.factories import running_session
from tests.gpus.conftest import use_fleet

pytestmark = pytest.mark.django_db
BUSYBOX = "gpu-portal/busybox:latest"
Kind = StorageUse.Kind
KIB, MIB, GIB = 1024, 1024**2, 1024**3
L4 = SliceRequest(kind="whole", model="L4")
# What a person's notebook could leave in work/: a file in a folder they made unreadable, an empty file, a link
# to a file of the container's own, and a sparse file of a GiB.
FILL = (
    "mkdir /w/d && dd if=/dev/zero of=/w/d/data bs=4096 count=256 2>/dev/null && chmod 000 /w/d "
    "&& touch /w/empty && ln -s /bin/busybox /w/link && truncate -s 1G /w/sparse"
)


@pytest.fixture
def runtime(docker_engine: str) -> DockerRuntime:
    return DockerRuntime()


@pytest.fixture
def work_volume(runtime: DockerRuntime, alice: User) -> Iterator[str]:
    """Alice's work volume as her sessions left it, filled as above."""
    name = WorkVolume.for_owner(alice.pk).name
    runtime.client.containers.run(
        BUSYBOX, ["sh", "-c", FILL], volumes={name: {"bind": "/w", "mode": "rw"}}, network_mode="none", remove=True
    )
    yield name
    runtime.client.volumes.get(name).remove(force=True)


@pytest.fixture
def session(notebook_image: NotebookImage, alice: User) -> NotebookSession:
    return running_session(alice, notebook_image, L4, "lab")


@pytest.fixture
def session_container(runtime: DockerRuntime, session: NotebookSession) -> Iterator[str]:
    """The session's container as the spawner starts it (its labels), with 3 MiB written outside work/."""
    labels = {"gpu-portal.session": str(session.pk), INSTANCE_LABEL: settings.INSTANCE_ID}
    command = ["sh", "-c", "dd if=/dev/zero of=/big bs=1048576 count=3 2>/dev/null; touch /written; sleep 300"]
    found = runtime.client.containers.run(BUSYBOX, command, labels=labels, network_mode="none", detach=True)
    while found.exec_run(["test", "-e", "/written"]).exit_code != 0:
        pass
    yield str(found.id)
    runtime.remove(str(found.id))


@pytest.mark.docker
def test_a_work_volume_is_measured_without_following_links_with_sparse_files_at_full_length(
    runtime: DockerRuntime, work_volume: str, alice: User
) -> None:
    assert tasks.measure_storage() >= 1

    found = StorageUse.objects.get(kind=Kind.WORK_VOLUME, key=work_volume)
    # d/ and its 1 MiB file (read although its owner made the folder unreadable), the empty file, the link
    # (not the 1.9 MiB busybox it names), the sparse file at its full length
    assert found.bytes == 4 * KIB + MIB + 4 * KIB + 4 * KIB + GIB
    assert (found.owner_id, found.label, found.url) == (alice.pk, "work/", reverse("session-list"))
    assert runtime.client.volumes.get(work_volume).attrs["Name"] == work_volume


@pytest.mark.docker
def test_a_person_who_never_started_a_notebook_has_no_volume_measured_nor_made(
    runtime: DockerRuntime, alice: User
) -> None:
    name = WorkVolume.for_owner(alice.pk).name
    notebook_storage.measure_all()
    assert not StorageUse.objects.filter(owner=alice).exists()
    assert name not in {volume.name for volume in runtime.client.volumes.list()}, "measuring made no volume"


@pytest.mark.docker
def test_a_session_containers_writable_layer_counts_and_goes_with_its_container(
    runtime: DockerRuntime, session: NotebookSession, session_container: str, alice: User
) -> None:
    notebook_storage.measure_all()

    layer = StorageUse.objects.get(kind=Kind.CONTAINER_LAYER, key=str(session.pk))
    assert layer.owner_id == alice.pk and layer.label == "lab"
    assert 3 * MIB <= layer.bytes < 4 * MIB, layer.bytes

    runtime.remove(session_container)
    notebook_storage.measure_all()
    assert not StorageUse.objects.filter(kind=Kind.CONTAINER_LAYER).exists()


@pytest.mark.docker
def test_each_engine_is_measured_on_its_own_and_a_silent_one_keeps_its_hosts_figures(
    docker_engine: str, work_volume: str, notebook_image: NotebookImage, alice: User, settings
) -> None:  # type: ignore[no-untyped-def]
    """Host far's engine is first away, then answers (this machine's engine, reached at its own endpoint, as a
    second engine would be): its copy of alice's work folder and its session's layer follow it."""
    use_fleet(settings, "near: 1xL4:whole; far: 1xL4:whole")
    settings.DOCKER_ENGINES = {"far": "unix:///nonexistent/gpu-portal-far/docker.sock"}
    on_far = running_session(alice, notebook_image, SliceRequest("whole", "", "L4", host="far"), "far-lab")
    usage.record(alice.pk, Kind.WORK_VOLUME, f"{work_volume}@far", label="work/ on far", size=5 * MIB)
    usage.record(alice.pk, Kind.CONTAINER_LAYER, str(on_far.pk), label="far-lab", size=2 * MIB)

    notebook_storage.measure_all()

    local = StorageUse.objects.get(kind=Kind.WORK_VOLUME, key=work_volume)
    assert local.bytes > GIB, "this machine's engine is measured although far's does not answer"
    kept = StorageUse.objects.get(kind=Kind.WORK_VOLUME, key=f"{work_volume}@far")
    assert kept.bytes == 5 * MIB, "far's figure stays as it was while nobody can look"
    assert StorageUse.objects.get(kind=Kind.CONTAINER_LAYER, key=str(on_far.pk)).bytes == 2 * MIB

    settings.DOCKER_ENGINES = {"far": docker_engine}
    notebook_storage.measure_all()

    far = StorageUse.objects.get(kind=Kind.WORK_VOLUME, key=f"{work_volume}@far")
    assert (far.bytes, far.label) == (local.bytes, "work/ on far"), "far's copy measured on far's engine"
    assert not StorageUse.objects.filter(kind=Kind.CONTAINER_LAYER).exists(), "no container of far-lab on far"
    assert usage.used_by(alice.pk) == 2 * local.bytes


def as_user(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_a_launch_is_refused_while_the_persons_files_fill_their_quota_and_nothing_is_allocated(
    notebook_image: NotebookImage, alice: User, bob: User, settings
) -> None:  # type: ignore[no-untyped-def]
    settings.STORAGE_QUOTA_BYTES = 10 * MIB
    usage.record(alice.pk, Kind.WORK_VOLUME, "vol", label="work/", size=8 * MIB)
    usage.record(alice.pk, Kind.RENDER_JOB, "7", label="shot.blend", size=2 * MIB, parts={"scene": 2 * MIB})
    fields = {"offer": "mig:H200-SXM5-141GB:1g.18gb", "image": notebook_image.pk, "server_name": "lab"}

    answer = as_user(alice).post(reverse("session-launch"), fields)

    assert answer.status_code == 200
    text = " ".join(html.unescape(strip_tags(answer.content.decode())).split())
    assert (
        "A new session is refused while your files fill your storage quota. You use 10 MiB of your 10 MiB storage "
        "quota: notebook work folder 'work/' 8 MiB; render job 'shot.blend' 2 MiB (scene 2 MiB)" in text
    ), text
    assert not NotebookSession.objects.exists() and not Slice.objects.exists()
    assert as_user(bob).post(reverse("session-launch"), fields).status_code == 302, "bob's quota is his own"


def test_a_running_sessions_card_warns_while_the_quota_is_full_and_the_session_keeps_running(
    session: NotebookSession, alice: User, settings
) -> None:  # type: ignore[no-untyped-def]
    settings.STORAGE_QUOTA_BYTES = 10 * MIB
    client = as_user(alice)
    usage.record(alice.pk, Kind.WORK_VOLUME, "vol", label="work/", size=9 * MIB)
    assert 'data-testid="storage-warning"' not in client.get(reverse("session-list")).content.decode()

    usage.record(alice.pk, Kind.WORK_VOLUME, "vol", label="work/", size=11 * MIB)
    page = client.get(reverse("session-list")).content.decode()

    card = page.split(f'id="session-{session.pk}"', 1)[1].split("</article>", 1)[0]
    assert 'data-testid="storage-warning"' in card
    words = " ".join(strip_tags(card).split())
    assert "Your files take 11 MiB of your 10 MiB storage quota" in words and "keeps running" in words
    session.refresh_from_db()
    assert session.state == NotebookSession.State.RUNNING
    section = page.split('id="storage"', 1)[1].split("</section>", 1)[0]
    assert "11 MiB of 10 MiB" in " ".join(strip_tags(section).split())
