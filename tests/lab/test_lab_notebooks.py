"""Notebooks on the chosen host through Swarm (issue 32, item 2), on the lab: the portal launches a session,
its Celery worker asks the hub, the hub (inside the lab, in the switch's namespace, with its proxy) starts the
server through our Swarm spawner as a service pinned by node id to the host the allocator chose, JupyterLab
answers through the one public address, the host's fence keeps the server from everything of the lab but the
hub (probed from inside it), and the stop ends it with the engine's moments."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from django.contrib.auth.models import User

from portal.celery import app
from sessions.gpus.allocator import SliceRequest
from sessions.gpus.models import Gpu, GpuHost, Slice
from sessions.notebooks.hub import Hub
from sessions.notebooks.models import NotebookImage, NotebookSession
from sessions.notebooks.services import Launch, start_session, stop_session
from sessions.runtime import swarm
from sessions.runtime.times import engine_time
from tests.conftest import ARTIFACTS, ROOT, RUN_ID, STACK
from tests.gpus.conftest import use_fleet
from tests.helpers import processes
from tests.helpers.waiting import state_of, wait_for
from tests.lab import invariants
from tests.lab.conftest import LAB_HUB_URL, LAB_PORTS
from tests.lab.fleet import fleet_spec
from tests.lab.lab import SWITCH_ADDRESS, TEST_LAB, Lab, connect_probe

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
def through_the_lab(lab_worker: str, settings) -> Iterator[None]:  # type: ignore[no-untyped-def]
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
    [service_id] = manager.docker(
        "service", "ls", "-q", "--filter", f"label=gpu-portal.session={session.pk}"
    ).split() or [""]
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
    [container_id] = host.docker("ps", "-q", "--filter", f"label=gpu-portal.session={session.pk}").split()
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
    assert manager.docker("service", "ls", "-q", "--filter", f"label=gpu-portal.session={session.pk}").split() == []
    assert session.container_gone_at is not None and session.container_gone_at >= session.container_started_at
    assert not Slice.objects.get(pk=taken.pk).active


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
    [container_id] = host.docker("ps", "-q", "--filter", f"label=gpu-portal.session={session.pk}").split()
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
    assert host.docker("ps", "-aq", "--filter", f"label=gpu-portal.session={session.pk}").split() == []
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
    services_left = lab.manager.docker("service", "ls", "-q", "--filter", f"label=gpu-portal.session={session.pk}")
    assert services_left.split() == [], "the service of a failed start is removed"
    containers = lambda: host.docker("ps", "-aq", "--filter", f"label=gpu-portal.session={session.pk}").split()  # noqa: E731
    wait_for(lambda: not containers(), 30, "Swarm to remove the failed task's container with its service")
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
