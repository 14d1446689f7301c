"""Starting and stopping sessions in the portal: refusals come at once, nothing is left behind."""

from __future__ import annotations

import json

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.test import Client

from sessions.gpus.allocator import SliceRequest, allocate
from sessions.gpus.holders import Holder
from sessions.gpus.models import Slice
from sessions.notebooks.models import NotebookImage, NotebookSession
from sessions.notebooks.services import (
    LAUNCH_FAILED,
    ContainerEnd,
    Launch,
    LaunchRefused,
    record_event,
    start_session,
    stop_session,
)

pytestmark = pytest.mark.django_db
MIG = SliceRequest("mig", "1g.18gb")


def launch(user: User, image: NotebookImage, name: str = "lab", request: SliceRequest = MIG) -> NotebookSession:
    return start_session(user, Launch(request, image.pk, name))


def nothing_left(user: User) -> bool:
    return not Slice.objects.filter(owner=user, released_at__isnull=True).exists()


def test_a_launch_allocates_a_slice_and_waits_for_the_hub(notebook_image: NotebookImage, alice: User) -> None:
    session = launch(alice, notebook_image)
    assert session.state == NotebookSession.State.STARTING
    assert session.slice is not None and session.slice.holder == Holder.notebook(session.pk)


@pytest.mark.parametrize("name", ["Lab", "-lab", "lab_1", "a" * 40, "lab 1", "läb", ""])
def test_a_session_name_with_odd_characters_is_refused(notebook_image: NotebookImage, alice: User, name: str) -> None:
    with pytest.raises(LaunchRefused, match="lower-case letters"):
        launch(alice, notebook_image, name)
    assert not NotebookSession.objects.exists() and nothing_left(alice)


def test_an_image_off_the_list_is_refused(notebook_image: NotebookImage, alice: User) -> None:
    notebook_image.enabled = False
    notebook_image.save()
    with pytest.raises(LaunchRefused, match="not on the list") as refused:
        launch(alice, notebook_image)
    assert refused.value.code == "image"
    assert nothing_left(alice)


def test_no_capacity_is_refused_at_once_and_leaves_nothing(
    notebook_image: NotebookImage, alice: User, bob: User
) -> None:
    allocate(bob, SliceRequest("mig", "1g.18gb"))
    with pytest.raises(LaunchRefused, match="No 7g.141gb slice is free now") as refused:
        launch(alice, notebook_image, request=SliceRequest("mig", "7g.141gb"))
    assert refused.value.code == "no_capacity"
    assert not NotebookSession.objects.exists() and nothing_left(alice)


def test_a_quota_is_refused_at_once(notebook_image: NotebookImage, alice: User, settings) -> None:  # type: ignore[no-untyped-def]
    settings.MAX_SLICES_PER_USER = 0
    with pytest.raises(LaunchRefused, match="your limit") as refused:
        launch(alice, notebook_image)
    assert refused.value.code == "quota"
    assert not NotebookSession.objects.exists()


def test_a_launch_while_another_is_starting_is_refused(notebook_image: NotebookImage, alice: User) -> None:
    launch(alice, notebook_image, "first")
    with pytest.raises(LaunchRefused, match="still starting"):
        launch(alice, notebook_image, "second")
    assert Slice.objects.filter(owner=alice, released_at__isnull=True).count() == 1


def test_nobody_stops_another_users_session(notebook_image: NotebookImage, alice: User, bob: User) -> None:
    session = launch(alice, notebook_image)
    with pytest.raises(LaunchRefused, match="No such session among yours"):
        stop_session(session.pk, by=bob)
    session.refresh_from_db()
    assert session.state == NotebookSession.State.STARTING


def test_lifecycle_moments_are_written_once(notebook_image: NotebookImage, alice: User) -> None:
    session = launch(alice, notebook_image)
    first = record_event(session.pk, "container_started", container_id="abc").container_started_at
    assert record_event(session.pk, "container_started", container_id="abc").container_started_at == first
    ready = record_event(session.pk, "ready")
    assert ready.state == NotebookSession.State.RUNNING and ready.ready_at is not None
    ended = record_event(session.pk, "stopped", end=ContainerEnd(exit_code=0))
    assert ended.state == NotebookSession.State.STOPPED
    assert ended.ended_reason == NotebookSession.EndReason.INSIDE  # JupyterLab's own File > Shut Down
    gone, ended_at = ended.container_gone_at, ended.ended_at
    assert gone is not None and ended_at is not None
    again = record_event(session.pk, "stopped", end=ContainerEnd(exit_code=1))
    assert (again.container_gone_at, again.ended_at, again.state) == (gone, ended_at, NotebookSession.State.STOPPED)
    assert nothing_left(alice)


def test_the_slice_records_its_holder_and_the_moments_it_ran_there(notebook_image: NotebookImage, alice: User) -> None:
    """What billing reads: the holder by kind and id, held from the container's start to the moment it was gone."""
    from datetime import timedelta

    from django.utils import timezone

    session = launch(alice, notebook_image)
    slice_id = session.slice_id
    assert slice_id is not None
    assert Slice.objects.get(pk=slice_id).held_from is None  # allocated, nothing runs on it yet
    started = timezone.now() - timedelta(minutes=3)
    record_event(session.pk, "container_started", container_id="abc", at=started)
    record_event(session.pk, "container_started", container_id="abc", at=timezone.now())  # a repeat changes nothing
    held = Slice.objects.get(pk=slice_id)
    assert (held.holder, held.held_from, held.held_until) == (Holder.notebook(session.pk), started, None)
    gone = started + timedelta(seconds=150)
    ended = record_event(session.pk, "stopped", end=ContainerEnd(at=gone, exit_code=0))
    held.refresh_from_db()
    assert (held.held_from, held.held_until, ended.container_gone_at) == (started, gone, gone)
    assert not held.active


def test_a_failed_start_releases_the_slice_and_keeps_the_reason(notebook_image: NotebookImage, alice: User) -> None:
    session = launch(alice, notebook_image)
    failed = record_event(session.pk, "failed", message="404 Client Error: image missing")
    assert failed.state == NotebookSession.State.FAILED
    assert failed.failure_message == LAUNCH_FAILED  # words for its owner
    assert failed.failure_detail == "404 Client Error: image missing"  # the cause, for operators
    assert failed.container_gone_at is None and failed.ended_at is not None
    assert nothing_left(alice)


def running(user: User, image: NotebookImage) -> NotebookSession:
    session = launch(user, image)
    record_event(session.pk, "container_started", container_id="abc")
    return record_event(session.pk, "ready")


@pytest.mark.parametrize(
    ("end", "cause"),
    [
        (ContainerEnd(exit_code=137), "it was killed (exit code 137)"),
        (ContainerEnd(exit_code=137, oom_killed=True), "it ran out of memory (exit code 137)"),
        (ContainerEnd(exit_code=1), "it exited with code 1"),
        (ContainerEnd(), "it was removed"),
    ],
)
def test_a_container_that_ends_unasked_is_a_crash_not_a_stop(
    notebook_image: NotebookImage, alice: User, end: ContainerEnd, cause: str
) -> None:
    session = running(alice, notebook_image)
    crashed = record_event(session.pk, "stopped", end=end)
    assert crashed.state == NotebookSession.State.FAILED
    assert crashed.ended_reason == NotebookSession.EndReason.CRASHED
    assert crashed.badge == ("Crashed", "bad")
    assert cause in crashed.failure_message
    assert nothing_left(alice)


def test_a_container_asked_to_stop_is_a_stop_whatever_its_exit_code(notebook_image: NotebookImage, alice: User) -> None:
    session = running(alice, notebook_image)
    stop_session(session.pk, by=alice)  # no hub here: the request fails, the session stays stopping
    stopped = record_event(session.pk, "stopped", end=ContainerEnd(exit_code=143))
    assert stopped.state == NotebookSession.State.STOPPED
    assert stopped.ended_reason == NotebookSession.EndReason.USER
    assert stopped.badge == ("Stopped", "neutral")
    assert stopped.failure_message == ""


def hub_client() -> Client:
    return Client(HTTP_AUTHORIZATION=f"Bearer {settings.HUB_SERVICE_TOKEN}")


def test_the_launch_spec_is_only_for_the_hub_and_only_for_a_starting_session(
    notebook_image: NotebookImage, alice: User
) -> None:
    session = launch(alice, notebook_image)
    query = {"user": "alice", "server": "lab"}
    assert Client().get("/internal/notebooks/launch-spec", query).status_code == 403
    assert Client(HTTP_AUTHORIZATION="Bearer forged").get("/internal/notebooks/launch-spec", query).status_code == 403
    spec = hub_client().get("/internal/notebooks/launch-spec", query).json()
    assert spec["session"] == session.pk
    assert spec["container"]["device_ids"] == [session.slice.device_uuid]  # type: ignore[union-attr]
    assert spec["container"]["image"] == "gpu-portal/notebook:latest"
    for other in ({"user": "bob", "server": "lab"}, {"user": "alice", "server": "other"}):
        answer = hub_client().get("/internal/notebooks/launch-spec", other)
        assert answer.status_code == 404
        assert "start sessions from the portal" in answer.json()["error"]


def test_the_launch_spec_is_cut_to_the_size_its_host_s_agent_recorded(
    notebook_image: NotebookImage, alice: User
) -> None:
    """The spawner may run on another machine than the GPU host: the portal cuts the container's CPUs and memory
    to the host's recorded size, and says so; until an agent has recorded one, the spawner cuts to its own."""
    from sessions.gpus.models import GpuHost
    from sessions.runtime.spec import HOST_MEMORY_SHARE

    session = launch(alice, notebook_image, request=SliceRequest(kind=Slice.Kind.MIG, profile="7g.141gb"))
    query = {"user": "alice", "server": "lab"}
    unsized = hub_client().get("/internal/notebooks/launch-spec", query).json()
    assert unsized["sized_for_host"] == "" and unsized["container"]["cpus"] == 14  # 7 compute slices x 2
    assert session.slice is not None
    host = session.slice.gpu.host
    GpuHost.objects.filter(pk=host.pk).update(cpus=3, memory_mib=4096)
    sized = hub_client().get("/internal/notebooks/launch-spec", query).json()
    assert sized["sized_for_host"] == host.name
    assert sized["container"]["cpus"] == 3
    share, whole = HOST_MEMORY_SHARE
    assert sized["container"]["mem_bytes"] == min(unsized["container"]["mem_bytes"], 4096 * 2**20 * share // whole)
    assert sized["container"]["mem_bytes"] < unsized["container"]["mem_bytes"]


@pytest.mark.parametrize("header", ["Bearer t\u00f6ken", "Bearer \u2603", "t\u00f6ken", "Basic abc"])
def test_a_forged_or_non_ascii_bearer_token_is_refused_not_a_server_error(
    notebook_image: NotebookImage, alice: User, header: str
) -> None:
    launch(alice, notebook_image)
    client = Client(HTTP_AUTHORIZATION=header, raise_request_exception=False)
    assert client.get("/internal/notebooks/launch-spec", {"user": "alice", "server": "lab"}).status_code == 403
    body = json.dumps({"session": 1, "event": "ready"})
    assert client.post("/internal/notebooks/events", body, content_type="application/json").status_code == 403


def test_events_with_bad_bodies_get_clear_errors(notebook_image: NotebookImage, alice: User) -> None:
    session = launch(alice, notebook_image)
    post = hub_client().post
    assert post("/internal/notebooks/events", "nonsense", content_type="application/json").status_code == 400
    bad = post(
        "/internal/notebooks/events",
        json.dumps({"session": session.pk, "user": "alice", "event": "explode"}),
        "application/json",
    )
    assert bad.status_code == 400 and "Unknown event" in bad.json()["error"]
    missing = post(
        "/internal/notebooks/events",
        json.dumps({"session": 999999, "user": "alice", "event": "ready"}),
        "application/json",
    )
    assert missing.status_code == 404
    for body, error in (
        ({"at": "yesterday"}, "RFC 3339"),
        ({"at": "2999-01-01T00:00:00Z"}, "past moment"),
        ({"exit_code": "137"}, "whole number"),
    ):
        answer = post(
            "/internal/notebooks/events",
            json.dumps({"session": session.pk, "user": "alice", "event": "stopped", **body}),
            "application/json",
        )
        assert answer.status_code == 400 and error in answer.json()["error"]
    session.refresh_from_db()
    assert session.state == NotebookSession.State.STARTING


def test_a_start_from_an_engine_whose_clock_runs_minutes_ahead_is_recorded_not_refused(
    notebook_image: NotebookImage, alice: User
) -> None:
    """Refused, the report was lost and the session ran unbilled (issue 30, money 3)."""
    from datetime import timedelta

    from django.utils import timezone

    session = launch(alice, notebook_image)
    ahead = (timezone.now() + timedelta(minutes=3)).isoformat().replace("+00:00", "Z")
    body = {"session": session.pk, "user": "alice", "event": "container_started", "at": ahead}
    answer = hub_client().post("/internal/notebooks/events", json.dumps(body), "application/json")
    assert answer.status_code == 200
    session.refresh_from_db()
    assert session.container_started_at is not None and session.slice is not None
    assert Slice.objects.get(pk=session.slice.pk).held_from == session.container_started_at
