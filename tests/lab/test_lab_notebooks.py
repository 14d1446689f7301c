"""Notebooks on the chosen host through Swarm (issue 32, item 2), on the lab: the portal launches a session,
its Celery worker asks the hub, the hub (inside the lab, in the switch's namespace, with its proxy) starts the
server through our Swarm spawner as a service pinned by node id to the host the allocator chose, JupyterLab
answers through the one public address, the host's fence keeps the server from everything of the lab but the
hub (probed from inside it), and the stop ends it with the engine's moments."""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Iterator
from datetime import timedelta
from functools import partial
from pathlib import Path

import pytest
import requests
from django.conf import settings
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse
from oauth2_provider.models import get_application_model
from playwright.sync_api import Page, expect

from billing import meter
from billing.models import ChargedMinute
from portal.celery import app
from portal.sso.clients import HUB_CLIENT_ID
from sessions.gpus import hosts
from sessions.gpus.allocator import AllocationRefused, SliceRequest, allocate
from sessions.gpus.models import Gpu, GpuHost, Slice
from sessions.notebooks.hub import Hub
from sessions.notebooks.models import NotebookImage, NotebookSession
from sessions.notebooks.reconcile import reconcile
from sessions.notebooks.services import Launch, start_session, stop_session
from sessions.runtime import swarm
from sessions.runtime.times import engine_time
from tests.conftest import ARTIFACTS, ROOT, RUN_ID, STACK
from tests.e2e.conftest import log_in
from tests.gpus.conftest import use_fleet
from tests.helpers import processes
from tests.helpers.waiting import state_of, wait_for
from tests.lab import invariants
from tests.lab.conftest import LAB_HUB_URL, LAB_PORTS
from tests.lab.fleet import fleet_spec
from tests.lab.hosts import running_agents
from tests.lab.lab import SWITCH_ADDRESS, TEST_LAB, Lab, Node, connect_probe
from tests.render.stack import charged_by_the_meter

pytestmark = [
    pytest.mark.docker,
    pytest.mark.hub,
    pytest.mark.celery,
    pytest.mark.lab,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(processes.test_database_url().startswith("sqlite"), reason="the lab hosts reach PostgreSQL"),
]
LAB_QUEUE = f"lab-{RUN_ID}"


class LabHub:
    """JupyterHub and its proxy inside the lab (the switch's namespace), spawning through Swarm, reached at the
    public address, which is this machine's 127.0.0.1; ``restart`` stops it and starts it again on its data."""

    def __init__(self, lab: Lab, data: Path) -> None:
        self.lab, self.data = lab, data
        self.public = f"http://127.0.0.1:{LAB_PORTS['public']}"
        self.env = processes.child_env(
            PORTAL_PUBLIC_URL=self.public,
            PORTAL_INTERNAL_URL=f"http://127.0.0.1:{STACK['portal']}",  # the relay, on the switch's own loopback
            PORTAL_PROXY_API_PORT=str(LAB_PORTS["proxy_api"]),
            PORTAL_HUB_DATA_DIR=str(data),
            PORTAL_HUB_BIND_URL=LAB_HUB_URL,
            PORTAL_HUB_SPAWNER="swarm",
            PORTAL_SWARM_MANAGER=lab.manager.endpoint,
            PYTHONPATH=str(ROOT),
        )
        self.process = self._start()

    def _start(self) -> subprocess.Popen[bytes]:
        command = [str(processes.BIN / "jupyterhub"), "-f", str(ROOT / "compose/hub/jupyterhub_config.py")]
        hub = self.lab.start_in(None, command, self.env, ARTIFACTS / "logs" / "lab-jupyterhub.log", cwd=self.data)
        answers = lambda: processes.answers_200(f"{self.public}/jupyter/hub/api/")  # noqa: E731
        return processes.ready_or_stopped(hub, answers, 90, "the lab's hub")

    def restart(self) -> None:
        processes.stop(self.process)
        self.process = self._start()


@pytest.fixture(scope="module")
def lab_hubs(lab: Lab, hub_stack: object, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabHub]:
    hub = LabHub(lab, tmp_path_factory.mktemp("lab-hub"))
    yield hub
    processes.stop(hub.process)


@pytest.fixture(scope="module")
def lab_hub(lab_hubs: LabHub) -> str:
    """The lab hub's public address."""
    return lab_hubs.public


@pytest.fixture(scope="module")
def lab_worker(lab_hub: str) -> Iterator[str]:
    """A Celery worker of the portal's that calls the lab's hub, on a queue of its own."""
    name = f"lab-{RUN_ID}@127.0.0.1"
    worker = processes.start_celery_worker(
        name,
        ARTIFACTS / "logs" / "lab-celery-worker.log",
        PORTAL_CELERY_QUEUE=LAB_QUEUE,
        PORTAL_HUB_API_URL=f"{lab_hub}/jupyter/hub/api",
    )
    yield name
    processes.stop(worker)


@pytest.fixture
def through_the_lab(lab_worker: str, prices: None, settings) -> Iterator[None]:  # type: ignore[no-untyped-def]
    """This test's launches and stops go to the lab's worker (the portal's default queue, for this test)."""
    settings.HUB_API_URL = f"http://127.0.0.1:{LAB_PORTS['public']}/jupyter/hub/api"
    default = app.conf.task_default_queue
    app.conf.task_default_queue = LAB_QUEUE
    yield
    app.conf.task_default_queue = default


def test_a_session_runs_as_a_swarm_service_on_the_host_the_allocator_chose(
    lab: Lab, lab_hub: str, through_the_lab: None, notebook_image: NotebookImage, alice: User, settings
) -> None:  # type: ignore[no-untyped-def]
    use_fleet(settings, fleet_spec(TEST_LAB))
    host = lab.nodes[1]  # not the manager: the service is pinned there by node id
    session = start_session(alice, Launch(SliceRequest("whole", model="L4", host=host.name), notebook_image.pk, "far"))
    wait_for(
        lambda: state_of(session) in (NotebookSession.State.RUNNING, NotebookSession.State.FAILED), 180, "the launch"
    )
    assert state_of(session) == NotebookSession.State.RUNNING, session.failure_detail
    assert session.slice_id is not None
    taken = Slice.objects.get(pk=session.slice_id)

    manager = lab.manager
    [service_id] = services_of(lab, session) or [""]
    assert service_id, "the server is a Swarm service"
    service = json.loads(manager.docker("service", "inspect", service_id))[0]["Spec"]
    node_id = manager.docker("node", "inspect", host.name, "--format", "{{.ID}}").strip()
    task = service["TaskTemplate"]
    assert task["Placement"]["Constraints"] == [f"node.id=={node_id}"]
    assert task["RestartPolicy"]["Condition"] == "none", "Swarm never restarts it: the portal decides"
    assert task["Resources"]["Limits"]["Pids"] > 0 and task["Resources"]["Limits"]["NanoCPUs"] > 0
    assert task["ContainerSpec"]["CapabilityDrop"] == ["ALL"]
    assert f"NVIDIA_VISIBLE_DEVICES={taken.device_uuid}" in task["ContainerSpec"]["Env"]

    # The container runs on the chosen host's own engine, as the image's unprivileged user.
    [container_id] = containers_of(host, session, running=True)
    state = json.loads(host.docker("inspect", container_id))[0]
    assert state["Config"]["User"] in ("", "1000", "jovyan") and state["HostConfig"]["CapDrop"] == ["ALL"]
    started = engine_time(state["State"]["StartedAt"])
    assert session.container_started_at is not None and started is not None
    assert abs((session.container_started_at - started).total_seconds()) < 2

    # The fence (manage.py fence_swarm_host on each host): the notebook reaches the hub and nothing else of the
    # lab, neither the portal's services nor another host nor its own; only the hub's machine reaches its port.
    def reaches(address: str, port: int) -> bool:
        return host.docker("exec", container_id, *connect_probe("python3", address, port)).strip() == "0"

    other, manager_node = lab.nodes[2], lab.nodes[0]
    assert reaches(SWITCH_ADDRESS, LAB_PORTS["hub"]), "the hub"
    for address, port in [
        (SWITCH_ADDRESS, 5432),
        (other.address, 7946),
        (manager_node.address, 2377),
        (host.address, 7946),
    ]:
        assert lab.connects(None, address, port), f"{address}:{port} is open in the lab (the probe can succeed)"
        assert not reaches(address, port), f"the notebook must not reach {address}:{port}"
    published = int(host.docker("port", container_id, "8888/tcp").split()[0].rsplit(":", 1)[1])
    assert lab.connects(None, host.address, published), "the hub's proxy reaches the server"
    assert not lab.connects(other, host.address, published), "another host does not"
    status = Hub().servers(alice.username)["far"]
    wait_for(lambda: Hub().servers(alice.username)["far"].ready, 30, "the hub to mark the server ready")
    answer = requests.get(f"{lab_hub}{status.url}api", timeout=10, allow_redirects=False)
    assert answer.status_code in (200, 302), "JupyterLab answers through the one public address"

    stop_session(session.pk, by=alice)
    wait_for(lambda: state_of(session) == NotebookSession.State.STOPPED, 90, "the session to stop")
    assert services_of(lab, session) == []
    assert session.container_gone_at is not None and session.container_gone_at >= session.container_started_at
    assert not Slice.objects.get(pk=taken.pk).active


def services_of(lab: Lab, session: NotebookSession) -> list[str]:
    """The Swarm services of the session's server, as the lab's manager lists them."""
    return lab.manager.docker("service", "ls", "-q", "--filter", f"label=gpu-portal.session={session.pk}").split()


def containers_of(node: Node, session: NotebookSession, running: bool = False) -> list[str]:
    """The session's containers on one lab host's engine (``running``: only those that run)."""
    listed = "-q" if running else "-aq"
    return node.docker("ps", listed, "--filter", f"label=gpu-portal.session={session.pk}").split()


def in_state(session: NotebookSession, *states: str) -> bool:
    return state_of(session) in states


@pytest.fixture
def lab_sign_on(lab_hub: str, notebook_image: NotebookImage) -> str:
    """The portal takes the lab hub as its OAuth client too: the lab's public address is another door to the same
    portal, so the hub's callback there is one more of the client's redirect addresses."""
    application = get_application_model().objects.get(client_id=HUB_CLIENT_ID)
    application.redirect_uris = f"{settings.HUB_OAUTH_CALLBACK_URL} {lab_hub}/jupyter/hub/oauth_callback"
    application.save(update_fields=["redirect_uris"])
    return lab_hub


def test_two_sessions_land_on_two_hosts_one_opens_with_single_sign_on_and_both_stop_charged_once(
    lab: Lab, lab_sign_on: str, through_the_lab: None, notebook_image: NotebookImage, alice: User, page: Page,
    settings,  # type: ignore[no-untyped-def]
) -> None:  # fmt: skip
    """Two whole L4s asked for with no host named: the allocator puts them on the two hosts that have one, each
    runs there as a Swarm service with its own GPU, JupyterLab of one opens in the browser through the one public
    address with the portal's login alone, and once both are stopped every slice is free and every minute of
    each holding was charged once."""
    use_fleet(settings, fleet_spec(TEST_LAB))
    Gpu.objects.exclude(host__name__startswith=f"{TEST_LAB}-").update(state=Gpu.State.MISSING)  # the lab's alone
    sessions = []
    for name in ("first", "second"):  # one after the other: a person has one session starting at a time
        session = start_session(alice, Launch(SliceRequest("whole", model="L4"), notebook_image.pk, name))
        wait_for(partial(in_state, session, NotebookSession.State.RUNNING, NotebookSession.State.FAILED), 180, "launch")
        assert state_of(session) == NotebookSession.State.RUNNING, session.failure_detail
        sessions.append(session)
    taken = [Slice.objects.select_related("gpu__host").get(notebook=session) for session in sessions]
    hosts = [held.gpu.host.name for held in taken]
    assert sorted(hosts) == [lab.nodes[1].name, lab.nodes[2].name], hosts

    for session, held in zip(sessions, taken, strict=True):
        node = next(node for node in lab.nodes if node.name == held.gpu.host.name)
        [container_id] = containers_of(node, session, running=True)
        state = json.loads(node.docker("inspect", container_id))[0]
        assert f"NVIDIA_VISIBLE_DEVICES={held.device_uuid}" in state["Config"]["Env"]
        assert node.docker("info", "--format", "{{.Name}}").strip() == node.name, "the container's own engine"
        others = [other for other in lab.nodes if other.name != node.name]
        for other in others:
            assert containers_of(other, session, running=True) == []

    remote = sessions[1]
    wait_for(lambda: Hub().servers(alice.username)["second"].ready, 30, "the hub to mark the server ready")
    log_in(page, lab_sign_on, "alice")
    page.goto(f"{lab_sign_on}/jupyter/user/alice/{remote.server_name}/lab")
    expect(page).to_have_url(re.compile(rf"/jupyter/user/alice/{remote.server_name}/lab"), timeout=60_000)
    expect(page).to_have_title(re.compile("JupyterLab"), timeout=60_000)
    expect(page.locator("#jp-main-dock-panel")).to_be_visible(timeout=60_000)  # the lab itself, drawn
    page.screenshot(path=str(ARTIFACTS / "screenshots" / "lab-jupyterlab-on-a-remote-host.png"))

    for session in sessions:
        stop_session(session.pk, by=alice)
    for session in sessions:
        wait_for(partial(in_state, session, NotebookSession.State.STOPPED), 90, "the session to stop")
        assert session.container_gone_at is not None
    for held in taken:
        held.refresh_from_db()
        assert not held.active
        charged_by_the_meter(held)
    invariants.check(lab)


def test_a_server_asking_for_a_host_that_is_not_in_the_swarm_fails_with_the_reason(
    lab: Lab, lab_hub: str, through_the_lab: None, notebook_image: NotebookImage, alice: User, settings
) -> None:  # type: ignore[no-untyped-def]
    use_fleet(settings, f"{TEST_LAB}-n9: 1xL4:whole")  # a GPU host whose machine never joined the Swarm
    session = start_session(
        alice, Launch(SliceRequest("whole", model="L4", host=f"{TEST_LAB}-n9"), notebook_image.pk, "nowhere")
    )
    wait_for(lambda: state_of(session) == NotebookSession.State.FAILED, 90, "the launch to fail")
    assert f"No Swarm node is named {TEST_LAB}-n9" in session.failure_detail
    assert session.slice_id is not None and not Slice.objects.get(pk=session.slice_id).active


def test_a_hub_restarted_while_a_remote_server_runs_finds_it_again_and_stops_it_later(
    lab: Lab, lab_hubs: LabHub, through_the_lab: None, notebook_image: NotebookImage, alice: User, settings
) -> None:  # type: ignore[no-untyped-def]
    """The hub (with its proxy) stops and starts again while a server runs as a Swarm service on the third host:
    the server runs on, untouched, the hub finds it again (its state names the service and the engine), the
    proxy has its route back, and JupyterLab answers through the public address; the portal's stop then ends
    it, with the container's own end, and the invariants hold."""
    use_fleet(settings, fleet_spec(TEST_LAB))
    host = lab.nodes[2]
    session = start_session(alice, Launch(SliceRequest("whole", model="L4", host=host.name), notebook_image.pk, "kept"))
    wait_for(
        lambda: state_of(session) in (NotebookSession.State.RUNNING, NotebookSession.State.FAILED), 180, "the launch"
    )
    assert state_of(session) == NotebookSession.State.RUNNING, session.failure_detail
    [container_id] = containers_of(host, session, running=True)
    started = host.docker("inspect", "--format", "{{.State.StartedAt}}", container_id).strip()

    lab_hubs.restart()

    wait_for(lambda: Hub().servers(alice.username).get("kept") is not None, 60, "the hub to know the server again")
    wait_for(lambda: Hub().servers(alice.username)["kept"].ready, 60, "the hub to find it running")
    assert host.docker("inspect", "--format", "{{.State.StartedAt}}", container_id).strip() == started, "untouched"
    url = f"{lab_hubs.public}{Hub().servers(alice.username)['kept'].url}api"

    def answers() -> bool:
        return requests.get(url, timeout=10, allow_redirects=False).status_code in (200, 302)

    wait_for(answers, 60, "JupyterLab through the public address, its route back in the proxy")
    assert state_of(session) == NotebookSession.State.RUNNING

    stop_session(session.pk, by=alice)
    wait_for(lambda: state_of(session) == NotebookSession.State.STOPPED, 90, "the session to stop")
    assert containers_of(host, session) == []
    assert session.container_gone_at is not None
    invariants.check(lab)


def test_a_task_that_fails_to_start_on_its_node_fails_the_launch_at_once_with_the_nodes_reason(
    lab: Lab, lab_hub: str, through_the_lab: None, notebook_image: NotebookImage, alice: User, settings
) -> None:  # type: ignore[no-untyped-def]
    """The second host's NVIDIA runtime no longer knows its L4 (a driver that lost the GPU): Swarm's task fails
    to start there. The spawner takes that for a failure at once, not for a task still pending: the launch fails
    within seconds with the runtime's own words, the service is gone, the slice is free, nothing is charged."""
    use_fleet(settings, fleet_spec(TEST_LAB))
    host = lab.nodes[1]
    known = host.folder / "gpus"
    kept = known.read_text()
    l4 = Gpu.objects.get(host__name=host.name, model_name="L4-24GB").uuid
    known.write_text("".join(f"{uuid}\n" for uuid in kept.split() if uuid != l4))
    try:
        began = time.monotonic()
        request = SliceRequest("whole", model="L4", host=host.name)
        session = start_session(alice, Launch(request, notebook_image.pk, "refused"))
        wait_for(lambda: state_of(session) == NotebookSession.State.FAILED, 90, "the launch to fail")
        took = time.monotonic() - began
    finally:
        known.write_text(kept)
    assert f"no such GPU on this host: {l4}" in session.failure_detail, session.failure_detail
    assert took < 30, f"the failure took {took:.0f} s: a rejected task is no pending one"
    assert services_of(lab, session) == [], "the service of a failed start is removed"
    gone = lambda: not containers_of(host, session)  # noqa: E731
    wait_for(gone, 30, "Swarm to remove the failed task's container with its service")
    assert session.slice_id is not None and not Slice.objects.get(pk=session.slice_id).active
    invariants.check(lab)


def test_a_host_that_left_the_swarm_is_seen_gone_and_its_launches_fail_with_the_reason_until_it_rejoins(
    lab: Lab, lab_hub: str, through_the_lab: None, notebook_image: NotebookImage, alice: User, settings
) -> None:  # type: ignore[no-untyped-def]
    """The third host leaves the Swarm: the fleet's Swarm watch sees it gone, and a launch there fails at once
    saying so (the slice released, nothing charged); once it joins again the watch has it ready."""
    use_fleet(settings, fleet_spec(TEST_LAB))
    settings.SWARM_MANAGER = lab.manager.endpoint
    host = lab.nodes[2]
    lab.leave(host)
    try:
        swarm.watch()
        assert GpuHost.objects.get(name=host.name).swarm_state == "", "no Swarm node of that name"
        request = SliceRequest("whole", model="L4", host=host.name)
        session = start_session(alice, Launch(request, notebook_image.pk, "gone"))
        wait_for(lambda: state_of(session) == NotebookSession.State.FAILED, 90, "the launch to fail")
        assert f"No Swarm node is named {host.name}" in session.failure_detail, session.failure_detail
        assert session.slice_id is not None and not Slice.objects.get(pk=session.slice_id).active
    finally:
        lab.rejoin(host)
    swarm.watch()
    assert GpuHost.objects.get(name=host.name).swarm_state == "ready"
    invariants.check(lab)


def swarm_of(name: str) -> tuple[str, str]:
    swarm.watch()  # what beat does every few seconds
    gpu_host = GpuHost.objects.get(name=name)
    return gpu_host.swarm_state, gpu_host.swarm_availability


def test_a_cut_link_loses_its_host_within_the_bound_and_its_session_ends_charged_to_its_last_proof(
    lab: Lab, lab_hub: str, through_the_lab: None, notebook_image: NotebookImage, alice: User, staff: User, settings
) -> None:  # type: ignore[no-untyped-def]
    """The third host's link is cut while a session runs there, its agent beating at the portal's own pace:
    the watch, at beat's pace, finds the host lost within the bound (PORTAL_HOST_LOST_AFTER_S plus one watch),
    nothing more is placed there, and nothing is charged past its last heartbeat; the other hosts beat on, and
    the cut one's agent runs on, cut off. Swarm, for its part, marks the node down (the fleet page says so
    beside the nodes that are ready and a machine that is not in the Swarm) and, since nothing may restart the
    server, shuts its task down: when the link is back, the node stops and removes the container. The portal
    then ends the session as crashed, settled to its last proof of life (the minutes of the cut, unproven, are
    not charged), each minute charged once, and the node is ready again on the fleet page."""
    settings.SWARM_MANAGER = lab.manager.endpoint
    use_fleet(settings, f"{fleet_spec(TEST_LAB)}; {TEST_LAB}-n9: 1xL4:whole")  # n9: a machine not in the Swarm
    host = lab.nodes[2]
    watch_every = float(app.conf.beat_schedule["watch-hosts"]["schedule"])
    with running_agents(lab, settings.HOST_HEARTBEAT_S) as agents:
        wait_for(lambda: GpuHost.objects.get(name=host.name).node_id == host.name, 60, "its agent to beat")
        assert all(swarm_of(node.name) == ("ready", "active") for node in lab.nodes)
        node_ids = {gpu_host.name: gpu_host.swarm_node for gpu_host in GpuHost.objects.all()}
        assert node_ids[f"{TEST_LAB}-n9"] == "" and len({node_ids[node.name] for node in lab.nodes}) == 3
        request = SliceRequest("whole", model="L4", host=host.name)
        session = start_session(alice, Launch(request, notebook_image.pk, "cut"))
        wait_for(partial(in_state, session, NotebookSession.State.RUNNING, NotebookSession.State.FAILED), 180, "launch")
        assert state_of(session) == NotebookSession.State.RUNNING, session.failure_detail
        held = Slice.objects.get(notebook=session)
        assert held.held_from is not None
        beaten = lambda: GpuHost.objects.get(name=host.name).heartbeat_at > held.held_from  # type: ignore[operator]  # noqa: E731
        wait_for(beaten, 30, "a heartbeat from the host while the session runs")
        lab.cut(host)
        cut_at = time.monotonic()
        try:
            while host.name not in hosts.watch()["lost"]:  # as beat runs it
                assert time.monotonic() - cut_at < 90, "the host was never lost"
                time.sleep(watch_every)
            detected = time.monotonic() - cut_at
            (ARTIFACTS / "lab-detection.txt").write_text(f"link cut to host lost: {detected:.1f} s\n")
            assert detected <= settings.HOST_LOST_AFTER_S + watch_every + 2 <= 30, f"lost after {detected:.1f} s"
            with pytest.raises(AllocationRefused, match="lost"):
                allocate(alice, SliceRequest("shared", model="A30", host=host.name))
            meter.tick()
            last_beat = GpuHost.objects.get(name=host.name).heartbeat_at
            assert last_beat is not None
            held.refresh_from_db()
            charged = list(ChargedMinute.objects.filter(usage__slice=held).values_list("minute", flat=True))
            assert held.seen_at is not None and held.seen_at <= last_beat, "no proof of life past the last beat"
            past = [minute for minute in charged if held.held_from + timedelta(minutes=minute) > last_beat]
            assert not past, f"charged {charged} from {held.held_from} to {held.seen_at}, last beat {last_beat}"
            hosts.watch()
            others = GpuHost.objects.filter(name__in=[node.name for node in lab.nodes[:2]])
            assert {other.state for other in others} == {GpuHost.State.UP}, "the other hosts beat on"
            assert agents[host.name].poll() is None, "its agent runs on, cut off"
            wait_for(lambda: lab.swarm_nodes().get(host.name) == "Down", 60, "the Swarm to see the node down")
            wait_for(lambda: swarm_of(host.name)[0] == "down", 30, "the fleet's record of it")
            fleet_page = Client()
            fleet_page.force_login(staff)
            page = fleet_page.get(reverse("fleet")).content.decode()
            assert "down, active" in page and "ready, active" in page and "not in the Swarm" in page
        finally:
            lab.mend(host)
        wait_for(lambda: GpuHost.objects.get(name=host.name).state == GpuHost.State.UP, 60, "its agent to beat again")
        wait_for(lambda: swarm_of(host.name) == ("ready", "active"), 60, "the fleet's record of its node back")

        def ended() -> bool:
            reconcile()  # as beat runs it
            return state_of(session) not in NotebookSession.ACTIVE

        wait_for(ended, 90, "the session to end: its node stopped the task Swarm had shut down")
    assert session.state == NotebookSession.State.FAILED and session.ended_reason == session.EndReason.CRASHED
    held.refresh_from_db()
    assert not held.active and held.held_until is not None and held.held_until <= last_beat
    charged_by_the_meter(held)
    wait_for(lambda: not services_of(lab, session), 60, "the hub to remove the service of the ended server")
    wait_for(lambda: not containers_of(host, session), 60, "Swarm to remove the task's container with its service")
    invariants.check(lab)


def test_a_hosts_engine_killed_mid_launch_fails_the_launch_saying_so_and_leaves_nothing_once_it_is_back(
    lab: Lab, lab_hub: str, through_the_lab: None, notebook_image: NotebookImage, alice: User, settings
) -> None:  # type: ignore[no-untyped-def]
    """The second host's dockerd dies (SIGKILL) as a launch there is on its way, before its server can run:
    Swarm sees the node down and gives the task up, and the launch fails saying so, where SwarmSpawner would
    wait out its whole start timeout for a node that does not answer: the service removed, the slice free,
    nothing charged. Once the engine runs again, the host is back in the Swarm with nothing of the launch."""
    use_fleet(settings, fleet_spec(TEST_LAB))
    host = lab.nodes[1]
    began = time.monotonic()
    request = SliceRequest("whole", model="L4", host=host.name)
    session = start_session(alice, Launch(request, notebook_image.pk, "engine"))
    lab.kill_engine(host)
    try:
        ended = partial(in_state, session, NotebookSession.State.FAILED, NotebookSession.State.RUNNING)
        wait_for(ended, 120, "the launch to end")
        took = time.monotonic() - began
    finally:
        lab.start_engine(host)
    assert state_of(session) == NotebookSession.State.FAILED, "the server never ran"
    assert "down" in session.failure_detail, session.failure_detail
    assert took < 60, f"the launch took {took:.0f} s to fail"
    assert not Slice.objects.get(notebook=session).active
    assert services_of(lab, session) == [], "the service of the start that never ran is removed"
    gone = lambda: not containers_of(host, session)  # noqa: E731
    wait_for(gone, 60, "nothing of the launch left on the host once its engine is back")
    invariants.check(lab)
