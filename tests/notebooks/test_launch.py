"""A session on a MIG slice, end to end: portal -> Celery -> hub -> our spawner -> Docker -> JupyterLab."""

from __future__ import annotations

import os
import time
import uuid

import pytest
import requests
from django.conf import settings
from django.contrib.auth.models import User
from django.utils import timezone

from sessions.gpus.allocator import SliceRequest
from sessions.gpus.models import Slice
from sessions.notebooks.hub import Hub, HubError, ServerStatus
from sessions.notebooks.models import NotebookImage, NotebookSession
from sessions.notebooks.services import Launch, start_session, stop_session
from sessions.notebooks.tasks import reconcile_sessions
from sessions.runtime.docker import DockerRuntime
from sessions.runtime.slices import spec_for
from sessions.runtime.spec import NO_IPV6
from sessions.runtime.times import engine_time
from tests.conftest import HubStack
from tests.gpus.conftest import use_fleet
from tests.helpers.processes import ENGINE_GONE_HOST, GONE_ENGINE
from tests.helpers.waiting import state_of, wait_for

pytestmark = [pytest.mark.hub, pytest.mark.docker, pytest.mark.celery, pytest.mark.django_db(transaction=True)]


def test_a_session_runs_jupyterlab_on_its_own_slice_and_stops_cleanly(
    hub: str, notebook_image: NotebookImage, alice: User
) -> None:
    session = start_session(alice, Launch(SliceRequest("mig", "1g.18gb"), notebook_image.pk, "lab-1"))
    wait_for(lambda: state_of(session) == NotebookSession.State.RUNNING, 120, "the session to run")
    assert session.slice is not None
    assert session.container_started_at and session.ready_at
    assert session.requested_at <= session.container_started_at <= session.ready_at

    runtime = DockerRuntime()
    [container_id] = runtime.containers_for("session", str(session.pk))
    # Billing charges from the engine's own moments, not from when the portal heard of them.
    state = runtime.client.containers.get(container_id).attrs["State"]
    assert session.container_started_at == engine_time(state["StartedAt"])
    # The nvidia driver puts the device into the container's first process, not into `docker exec`s.
    env = runtime.run_in(container_id, ["sh", "-c", "tr '\\0' '\\n' < /proc/1/environ"])
    devices = [line for line in env.splitlines() if line.startswith("NVIDIA_VISIBLE_DEVICES=")]
    assert devices == [f"NVIDIA_VISIBLE_DEVICES={session.slice.device_uuid}"]
    assert runtime.run_in(container_id, ["id", "-u"]).strip() == "1000"
    # The spawner applied the portal's container spec, as the Docker adapter applies it to batch work.
    attrs = runtime.client.containers.get(container_id).attrs
    spec = spec_for(session.slice, notebook_image.image, network=settings.USER_NETWORK.name)
    limits = spec.within_host(os.cpu_count(), os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")).limits
    host = attrs["HostConfig"]
    assert (host["NanoCpus"], host["Memory"], host["PidsLimit"]) == (
        int(limits.cpus * 1e9),
        limits.memory_bytes,
        limits.pids,
    )
    assert host["SecurityOpt"] == ["no-new-privileges:true"] and host["CapDrop"] == ["ALL"]
    rotated = {"max-size": str(settings.CONTAINER_LOG_MAX_BYTES), "max-file": str(settings.CONTAINER_LOG_FILES)}
    assert host["LogConfig"] == {"Type": "json-file", "Config": rotated}, "its log on the host's disk is bounded"
    assert host["Sysctls"] == NO_IPV6 and host["AutoRemove"] is False
    assert host["DeviceRequests"][0]["DeviceIDs"] == [session.slice.device_uuid]
    labels = attrs["Config"]["Labels"]
    assert labels["gpu-portal.instance"] == settings.INSTANCE_ID and labels["gpu-portal.session"] == str(session.pk)
    assert {f"CPU_LIMIT={limits.cpus}", f"MEM_LIMIT={limits.memory_bytes}"} <= set(attrs["Config"]["Env"])

    wait_for(lambda: Hub().servers("alice")["lab-1"].ready, 10, "the hub to mark the server ready")
    status = Hub().servers("alice")["lab-1"]
    answer = requests.get(f"{hub}{status.url}api", timeout=10, allow_redirects=False)
    assert answer.status_code in (200, 302)  # JupyterLab answers through the proxy (a login redirect without SSO)

    stop_session(session.pk, by=alice)
    wait_for(lambda: state_of(session) == NotebookSession.State.STOPPED, 60, "the session to stop")
    assert runtime.containers_for("session", str(session.pk)) == []
    assert session.container_gone_at is not None and session.container_gone_at >= session.ready_at
    died = runtime.died_at(session.pk, since=session.container_started_at)
    assert died is not None and abs((session.container_gone_at - died).total_seconds()) < 0.2
    assert session.ended_reason == NotebookSession.EndReason.USER
    assert session.slice is not None
    assert not Slice.objects.get(pk=session.slice.pk).active


def test_a_session_runs_on_its_hosts_engine_and_fails_with_it_named_when_that_engine_does_not_answer(
    hub: str,
    notebook_image: NotebookImage,
    alice: User,
    settings,  # type: ignore[no-untyped-def]
) -> None:
    # The portal's helper processes know this host's engine (PORTAL_DOCKER_ENGINES); no engine answers there,
    # where this machine's would have started the container.
    use_fleet(settings, f"{ENGINE_GONE_HOST}: 1xL4:whole")
    request = SliceRequest("whole", model="L4", host=ENGINE_GONE_HOST)
    session = start_session(alice, Launch(request, notebook_image.pk, "far-away"))
    wait_for(lambda: state_of(session) == NotebookSession.State.FAILED, 60, "the launch to fail")
    assert GONE_ENGINE in session.failure_detail and "does not answer" in session.failure_detail
    assert session.container_started_at is None and session.slice is not None
    assert not Slice.objects.get(pk=session.slice.pk).active
    assert DockerRuntime().containers_for("session", str(session.pk)) == []


def run_one(alice: User, image: NotebookImage, name: str) -> NotebookSession:
    session = start_session(alice, Launch(SliceRequest("mig", "1g.18gb"), image.pk, name))
    wait_for(lambda: state_of(session) == NotebookSession.State.RUNNING, 120, "the session to run")
    # The spawner tells the portal before it returns to the hub, which then routes the server and marks it ready.
    wait_for(lambda: Hub().servers(alice.username)[name].ready, 10, "the hub to mark the server ready")
    return session


def test_a_container_killed_by_hand_ends_at_the_moment_docker_recorded(
    hub: str, notebook_image: NotebookImage, alice: User
) -> None:
    session = run_one(alice, notebook_image, "doomed")
    runtime = DockerRuntime()
    [container_id] = runtime.containers_for("session", str(session.pk))
    container = runtime.client.containers.get(container_id)
    container.kill()
    container.reload()
    finished = engine_time(container.attrs["State"]["FinishedAt"])
    time.sleep(3)  # reconciliation notices late (every 20 s in production): billing must not charge the gap
    noticed = timezone.now()
    reconcile_sessions.delay().get(timeout=60)
    wait_for(lambda: state_of(session) == NotebookSession.State.FAILED, 60, "reconciliation")
    assert session.ended_reason == NotebookSession.EndReason.CRASHED  # nobody asked it to stop
    assert "killed (exit code 137)" in session.failure_message
    assert finished is not None and session.container_gone_at == finished
    assert (noticed - session.container_gone_at).total_seconds() >= 3
    assert session.slice is not None and not Slice.objects.get(pk=session.slice.pk).active
    wait_for(lambda: runtime.containers_for("session", str(session.pk)) == [], 30, "the dead container's removal")


def test_a_container_removed_by_hand_ends_when_the_engine_saw_it_die(
    hub: str, notebook_image: NotebookImage, alice: User
) -> None:
    session = run_one(alice, notebook_image, "vanished")
    runtime = DockerRuntime()
    [container_id] = runtime.containers_for("session", str(session.pk))
    removed_at = timezone.now()
    runtime.client.containers.get(container_id).remove(force=True)  # no state left to read: only the event log
    removed_by = timezone.now()
    time.sleep(3)  # reconciliation notices late: the end must be the engine's moment, not the noticing
    reconcile_sessions.delay().get(timeout=60)
    wait_for(lambda: state_of(session) == NotebookSession.State.FAILED, 60, "reconciliation")
    assert "it was removed" in session.failure_message
    assert session.container_gone_at is not None
    # Bounded by what the test saw, however slow the engine was to remove it (one clock: the same host).
    assert removed_at <= session.container_gone_at <= removed_by
    assert session.slice is not None and not Slice.objects.get(pk=session.slice.pk).active


def test_making_a_person_the_hub_knows_already_is_no_error(hub: str) -> None:
    api = Hub()
    api.ensure_user("hub-newcomer")
    api.ensure_user("hub-newcomer")  # the hub answers 409: known already
    known = requests.get(
        f"{settings.HUB_API_URL.rstrip('/')}/users/hub-newcomer",
        headers={"Authorization": f"token {settings.HUB_SERVICE_TOKEN}"},
        timeout=10,
    )
    assert known.status_code == 200 and known.json()["name"] == "hub-newcomer"


def test_forged_user_options_sent_to_the_hub_are_refused(hub: str, notebook_image: NotebookImage, alice: User) -> None:
    api = Hub()
    api.ensure_user("alice")
    with pytest.raises(HubError, match="HTTP 400"):
        api.start_server("alice", "forged", {"image": "someone/else:latest", "device_ids": ["GPU-all"]})
    assert "forged" not in api.servers("alice")


def test_a_launch_begun_at_the_hub_without_the_portal_starts_nothing(
    hub: str, notebook_image: NotebookImage, alice: User
) -> None:
    api = Hub()
    api.ensure_user("alice")
    api.start_server("alice", "rogue", {})
    idle = ServerStatus(False, None, "", None)
    wait_for(lambda: not api.servers("alice").get("rogue", idle).pending, 30, "the hub to give up the spawn")
    assert not api.servers("alice").get("rogue", idle).ready
    assert DockerRuntime().containers_for("session") == []
    api.stop_server("alice", "rogue")
    assert not Slice.objects.filter(released_at__isnull=True).exists()


def test_a_hub_restart_keeps_a_running_session(hub_stack: HubStack, notebook_image: NotebookImage, alice: User) -> None:
    session = run_one(alice, notebook_image, "survivor")
    hub_stack.restart()
    status = Hub().servers("alice")["survivor"]
    assert status.ready
    answer = requests.get(f"{hub_stack.url}{status.url}api", timeout=10, allow_redirects=False)
    assert answer.status_code in (200, 302)
    assert state_of(session) == NotebookSession.State.RUNNING
    assert reconcile_sessions.delay().get(timeout=60).get("ended", 0) == 0
    assert state_of(session) == NotebookSession.State.RUNNING
    stop_session(session.pk, by=alice)
    wait_for(lambda: state_of(session) == NotebookSession.State.STOPPED, 60, "the session to stop")


def test_a_persons_work_folder_outlives_their_sessions(hub: str, notebook_image: NotebookImage, alice: User) -> None:
    runtime = DockerRuntime()
    first = run_one(alice, notebook_image, "writer")
    [container_id] = runtime.containers_for("session", str(first.pk))
    token = uuid.uuid4().hex  # the volume may hold files from earlier runs of this test
    runtime.run_in(container_id, ["sh", "-c", f"echo {token} > /home/jovyan/work/notes.txt"])
    stop_session(first.pk, by=alice)
    wait_for(lambda: state_of(first) == NotebookSession.State.STOPPED, 60, "the first session to stop")
    second = run_one(alice, notebook_image, "reader")
    [container_id] = runtime.containers_for("session", str(second.pk))
    assert runtime.run_in(container_id, ["cat", "/home/jovyan/work/notes.txt"]).strip() == token
    stop_session(second.pk, by=alice)
    wait_for(lambda: state_of(second) == NotebookSession.State.STOPPED, 60, "the second session to stop")


def test_the_hubs_progress_stream_carries_the_spawners_steps(
    hub: str, notebook_image: NotebookImage, alice: User
) -> None:
    session = start_session(alice, Launch(SliceRequest("mig", "1g.18gb"), notebook_image.pk, "steps"))
    hub_api = Hub()
    # Attach while the hub still has the start pending: the stream then replays every step so far.
    wait_for(lambda: "steps" in hub_api.servers("alice") or state_of(session) != "starting", 60, "the hub to start")
    events = hub_api.progress("alice", "steps")
    messages = [event.get("message", "") for event in events]
    assert events[-1].get("ready") is True, events
    # Our steps, in order, before the hub's ready event (a container takes seconds to start: we attach in time).
    assert messages[0] == "Server requested" and messages[1].startswith("Slice allocated"), messages  # the hub's, ours
    assert any(m.startswith("Creating the container on MIG-") for m in messages), messages
    assert [e["progress"] for e in events[:-1]] == sorted(e["progress"] for e in events[:-1])
    with pytest.raises(HubError):
        hub_api.progress("alice", "no-such-server", timeout=5)
    stop_session(session.pk, by=alice)
    wait_for(lambda: state_of(session) == NotebookSession.State.STOPPED, 60, "the session to stop")


def test_someone_the_hub_has_never_seen_gets_their_server(hub: str, notebook_image: NotebookImage, roles: None) -> None:
    from tests.factories import make_user

    newcomer = make_user(f"new{uuid.uuid4().hex[:6]}", ["users"])
    assert Hub().servers(newcomer.username) == {}  # the hub does not know them yet
    session = run_one(newcomer, notebook_image, "first")
    assert Hub().servers(newcomer.username)["first"].ready
    stop_session(session.pk, by=newcomer)
    wait_for(lambda: state_of(session) == NotebookSession.State.STOPPED, 60, "the session to stop")
