"""Shared fixtures: the people (alice, bob, staff, billing), real helper processes, browser set-up."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.db import connections
from django.test import Client, TransactionTestCase

from portal.roles import BILLING, OPERATORS, USERS, ensure_roles
from sessions.gpus import agency, orders
from sessions.notebooks.models import NotebookImage
from sessions.runtime import network
from sessions.runtime.network import UserNetwork
from tests.factories import make_user
from tests.helpers import processes

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "artifacts"
RUN_ID = uuid.uuid4().hex[:8]
STACK = {name: processes.free_port() for name in ("public", "portal", "hub", "proxy_api")}
# The render folder this run's processes share (daphne stores uploads there, the default queue's worker unpacks
# them, the render worker renders): outside pytest's temporary folders, which another pytest run on the machine
# prunes while this run's workers may still write into them. Tests of files alone use a folder of their own.
RENDER_ROOT = Path(f"/var/tmp/gpu-portal-render-root-{RUN_ID}")  # noqa: S108  # named for this run alone
TEST_NETWORK_PREFIX = "gpu-portal-test-"


def pytest_configure(config: pytest.Config) -> None:
    """Keep this run's Redis keys, queues and groups apart from a running portal and other runs."""
    settings.CELERY_TASK_DEFAULT_QUEUE = f"test-{RUN_ID}"
    # One render folder for this process, daphne and the workers (processes.child_env passes it on).
    settings.RENDER_DIR = RENDER_ROOT
    RENDER_ROOT.mkdir(exist_ok=True)
    settings.INSTANCE_ID = f"test-{RUN_ID}"  # reconciliation here never touches another run's containers
    settings.CACHES["default"]["KEY_PREFIX"] = f"test-{RUN_ID}"
    settings.CHANNEL_LAYERS["default"]["CONFIG"]["prefix"] = f"test-{RUN_ID}"  # type: ignore[index]
    settings.CHANNEL_LAYERS["metrics"]["CONFIG"]["prefix"] = f"test-{RUN_ID}-metrics"  # type: ignore[index]
    from portal.celery import app

    app.conf.task_default_queue = settings.CELERY_TASK_DEFAULT_QUEUE
    # One public address for this run (the proxy), the portal behind it and the hub: every
    # helper process gets the same through processes.child_env().
    public = f"http://127.0.0.1:{STACK['public']}"
    settings.PUBLIC_URL = public
    settings.HUB_OAUTH_CALLBACK_URL = f"{public}/jupyter/hub/oauth_callback"
    settings.OAUTH2_PROVIDER["OIDC_ISS_ENDPOINT"] = f"{public}/o"
    # Notebook containers go on a bridge of this run's own, as in production; the hub listens on its gateway.
    settings.USER_NETWORK = test_network()
    settings.HUB_API_URL = f"{settings.USER_NETWORK.hub_url}/jupyter/hub/api"
    # Passwords hashed in a blink here (tests/helpers/hashers.py); the portal's processes keep Django's hashers.
    settings.PASSWORD_HASHERS = ["tests.helpers.hashers.OneIterationPBKDF2PasswordHasher"]
    # People in most tests start sessions without credit; billing's own tests turn the credit check on.
    settings.BILLING_MIN_MINUTES = 0
    # The manifest storage needs collected static files, as in production. make test's passes start together
    # and two share the data folder: one collects at a time (whitenoise's compression of a file the other
    # was replacing failed a fresh clone's run).
    static_root = Path(settings.STATIC_ROOT)
    static_root.parent.mkdir(parents=True, exist_ok=True)
    with open(static_root.parent / "collectstatic.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        call_command("collectstatic", interactive=False, verbosity=0)
    (ARTIFACTS / "logs").mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "screenshots").mkdir(parents=True, exist_ok=True)
    _flush_again_after_a_deadlock()


def pytest_unconfigure(config: pytest.Config) -> None:
    shutil.rmtree(RENDER_ROOT, ignore_errors=True)


def _flush_again_after_a_deadlock() -> None:
    """A test's database is emptied by one TRUNCATE of every table, which takes their locks one by one; the
    real helper processes (a Celery worker charging a session that just ended, daphne taking the hub's
    report) may write to two of them meanwhile, and PostgreSQL then ends one side as a deadlock. A
    clean-clone run lost a test that way (its assertions had all passed): the flush, undone whole, runs again.
    """
    original = TransactionTestCase._fixture_teardown  # type: ignore[attr-defined]  # not in the stubs

    def teardown(self: TransactionTestCase) -> None:
        for attempt in range(5):
            try:
                original(self)
                return
            except CommandError as error:
                if attempt == 4 or "deadlock detected" not in str(error.__cause__):
                    raise
                time.sleep(0.5)

    TransactionTestCase._fixture_teardown = teardown  # type: ignore[attr-defined]


def test_network() -> UserNetwork:
    """A user-container network for this run: its own name and a 10.88.N.0/24 no Docker network holds."""
    taken: set[str] = set()
    # No engine (a run without the docker tests): any subnet will do.
    with contextlib.suppress(Exception):
        import docker

        client = docker.from_env(timeout=5)
        for found in client.networks.list():
            taken.update(str(pool.get("Subnet")) for pool in (found.attrs.get("IPAM", {}).get("Config") or []))
    start = int(RUN_ID, 16) % 100
    for step in range(100):
        subnet = f"10.88.{100 + (start + step) % 100}.0/24"
        if subnet not in taken:
            # Internet off: whatever a notebook tries outside is refused on this host, never sent.
            return network.parse(f"{TEST_NETWORK_PREFIX}{RUN_ID}", subnet, False, STACK["hub"])
    raise RuntimeError("every 10.88.100-199.0/24 is taken by a Docker network; remove old gpu-portal-test-* ones")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Browser tests go last: Playwright's sync API keeps an event loop running in
    this thread for the rest of the session, which asyncio tests cannot share. So
    does any other test that opens a page (the lab's single sign-on test)."""
    browser_tests = [
        item for item in items if "tests/e2e/" in str(item.path) or "page" in getattr(item, "fixturenames", ())
    ]
    for item in browser_tests:
        if "tests/e2e/" in str(item.path):
            item.add_marker(pytest.mark.e2e)
    items[:] = [item for item in items if item not in browser_tests] + browser_tests


@pytest.fixture(autouse=True)
def placement_demand_forgotten() -> Iterator[None]:
    """Each process keeps the demand it learned from slices (``sessions/gpus/demand.py``) for a minute;
    a test's slices are rolled back after it, so the next test starts from what its own slices say."""
    from sessions.gpus import demand

    demand.forget()
    yield
    demand.forget()


@pytest.fixture(scope="session", autouse=True)
def database_pools_closed_at_the_end(django_db_setup: None, django_db_blocker: Any) -> Iterator[None]:
    """The connection pool keeps connections open; the test database can only be dropped once they close."""
    yield
    from django.db import connections

    with django_db_blocker.unblock():
        for connection in connections.all(initialized_only=True):
            connection.close()
            if hasattr(connection, "close_pool"):
                with contextlib.suppress(KeyError):
                    connection.close_pool()


class _SuiteAgent(orders.Executor):
    """The order executor of the test process (the agent of every simulated host): it carries out the orders the
    real portal processes the tests start record (daphne, the Celery workers), whose data is committed; a test's
    own orders are carried out at once in its transaction. Between tests that may not use the database it
    waits."""

    def _drain(self, heard: int = orders.EVERY_ORDER) -> None:
        try:
            connections["default"].ensure_connection()
            super()._drain(heard)
        except RuntimeError:  # pytest-django's guard: this test may not use the database (also once a test that
            # could ends mid-drain, when the executor's clean-up meets the guard: the thread must live on). A drain
            # cut off inside a transaction cannot roll its savepoint back through the guard either, and its
            # connection would stay idle in that transaction, blocking every later test's flush (a fresh-clone run
            # hung on it): closing the connection ends the transaction on the server's side.
            with contextlib.suppress(Exception):
                connections["default"].close()
            return


@pytest.fixture(scope="session", autouse=True)
def gpu_agent_here(database_pools_closed_at_the_end: None) -> Iterator[None]:
    """Only a host's agent changes its GPUs (``sessions.gpus.agency``): this process is the agent of every
    simulated host the tests make, and serves the orders of the portal processes they start. Tests of the rule
    itself step out of the role (``tests/gpus/test_orders.py``)."""
    agency.act_for([agency.EVERY_HOST])
    _SUITE_AGENT.append(_SuiteAgent().start())
    yield
    _SUITE_AGENT.pop().stop()
    agency.stop_acting_for([agency.EVERY_HOST])


_SUITE_AGENT: list[orders.Executor] = []  # the running one


@pytest.fixture
def suite_agent_stopped(gpu_agent_here: None) -> Iterator[None]:
    """The suite's order executor stopped for the test, which carries out orders itself, in its own time."""
    _SUITE_AGENT.pop().stop()
    yield
    _SUITE_AGENT.append(_SuiteAgent().start())


@pytest.fixture
def roles(db: None) -> None:
    ensure_roles()


@pytest.fixture
def alice(roles: None) -> User:
    return make_user("alice", [USERS])


@pytest.fixture
def bob(roles: None) -> User:
    return make_user("bob", [USERS])


@pytest.fixture
def staff(roles: None) -> User:
    return make_user("charlie", [USERS, OPERATORS], is_staff=True)


@pytest.fixture
def billing_user(roles: None) -> User:
    return make_user("dora", [USERS, BILLING])


@pytest.fixture
def alice_client(alice: User) -> Client:
    client = Client()
    client.force_login(alice)
    return client


@pytest.fixture(scope="session")
def celery_worker(django_db_setup: None, django_db_blocker: object) -> Iterator[str]:
    """A real Celery worker process on the Redis broker, using the test database."""
    name = f"test-{RUN_ID}@127.0.0.1"
    process = processes.start_celery_worker(name, ARTIFACTS / "logs" / "celery-worker.log")
    yield name
    processes.stop(process)


@pytest.fixture(scope="session")
def portal_server(django_db_setup: None, django_db_blocker: object) -> Iterator[str]:
    """The portal under daphne, as the run command starts it; yields its base URL."""
    process = processes.start_daphne(STACK["portal"], ARTIFACTS / "logs" / "daphne.log")
    yield f"http://127.0.0.1:{STACK['portal']}"
    processes.stop(process)


# Browser tests: Debian's Chromium, driven by Playwright (its own download does not work here).
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args: dict[str, object]) -> dict[str, object]:
    return {**browser_type_launch_args, "executable_path": CHROMIUM, "args": CHROMIUM_ARGS}


@pytest.fixture(scope="session")
def docker_engine() -> str:
    """A Docker engine answering on the default socket (started by compose/bin/ensure-docker)."""
    result = subprocess.run([str(ROOT / "compose/bin/ensure-docker")], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        pytest.fail(f"no Docker engine: {result.stderr.strip()}")
    subprocess.run([str(ROOT / "compose/bin/build-busybox-image")], check=True)
    return os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")


class HubStack:
    """JupyterHub (which runs configurable-http-proxy) in front of the portal, restartable by tests."""

    def __init__(self, data: Path) -> None:
        self.data = data
        self.url = f"http://127.0.0.1:{STACK['public']}"
        self.process = self._start()

    def _start(self) -> subprocess.Popen[bytes]:
        return processes.start_hub(STACK, self.data, ARTIFACTS / "logs" / "jupyterhub.log")

    def restart(self) -> None:
        processes.stop(self.process)
        self.process = self._start()

    def start(self) -> None:
        if self.process.poll() is not None:
            self.process = self._start()

    def stop(self) -> None:
        processes.stop(self.process)


@pytest.fixture(scope="session")
def user_network(docker_engine: str) -> Iterator[UserNetwork]:
    """This run's user-container bridge with its firewall, removed again at the end (with what ran on it)."""
    from sessions.runtime.docker import DockerRuntime
    from sessions.runtime.isolation import isolate, remove_stale, tear_down

    runtime = DockerRuntime()
    remove_stale(TEST_NETWORK_PREFIX, runtime)
    isolate(settings.USER_NETWORK, runtime)
    yield settings.USER_NETWORK
    for container_id in runtime.containers_on(settings.USER_NETWORK.name):
        runtime.remove(container_id)
    tear_down(settings.USER_NETWORK, runtime)


@pytest.fixture
def gateway_listener(user_network: UserNetwork) -> Iterator[int]:
    """A server of ours on the bridge's gateway, on a port that is not the hub's: the firewall must refuse
    it, as it refuses whatever a host runs on 0.0.0.0. Yields its port."""
    server = socket.create_server((user_network.gateway, 0))
    server.settimeout(0.2)
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            with contextlib.suppress(OSError):
                server.accept()[0].close()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield int(server.getsockname()[1])
    stop.set()
    thread.join()
    server.close()


@pytest.fixture(scope="session")
def hub_stack(
    portal_server: str, celery_worker: str, user_network: UserNetwork, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[HubStack]:
    from portal.datafiles import secret_file
    from portal.sso.clients import hub_secret_path
    from sessions.runtime.docker import DockerRuntime

    subprocess.run([str(ROOT / "compose/bin/ensure-proxy")], check=True)
    subprocess.run([str(ROOT / "compose/bin/build-notebook-image")], check=True)
    secret_file(hub_secret_path())
    stack = HubStack(tmp_path_factory.mktemp("hub"))
    yield stack
    stack.stop()
    runtime = DockerRuntime()
    for container_id in runtime.containers_on(user_network.name):
        runtime.remove(container_id)


@pytest.fixture
def hub(hub_stack: HubStack) -> str:
    """The public address: the proxy, with the hub under /jupyter/ and the portal everywhere else."""
    return hub_stack.url


@pytest.fixture
def notebook_image(db: None, settings) -> NotebookImage:  # type: ignore[no-untyped-def]
    """An image on the list, the hub's OAuth client, and a small simulated fleet to launch on."""
    from portal.sso.clients import register_hub_client
    from tests.gpus.conftest import use_fleet

    use_fleet(settings, "nb: 1xH200:mig, 1xL4:whole")
    register_hub_client()
    image, _ = NotebookImage.objects.get_or_create(
        name="JupyterLab", defaults={"image": "gpu-portal/notebook:latest", "default": True}
    )
    return image


@pytest.fixture
def quiet_render_queue(settings, tmp_path: Path) -> Iterator[str]:  # type: ignore[no-untyped-def]
    """Render work goes to a queue nobody reads here (emptied at the end), and jobs' folders to the test's own:
    for tests of what the database alone decides about render jobs."""
    from portal.celery import app

    settings.RENDER_DIR = tmp_path / "render"
    settings.RENDER_QUEUE = f"quiet-{uuid.uuid4().hex[:8]}"
    yield settings.RENDER_QUEUE
    from sessions.gpus.models import GpuHost

    hosts = list(GpuHost.objects.values_list("name", flat=True))  # each host's own render queue too
    with app.connection_for_write() as connection:
        for queue in [settings.RENDER_QUEUE, *(f"{settings.RENDER_QUEUE}@{host}" for host in hosts)]:
            connection.default_channel.queue_purge(queue)
