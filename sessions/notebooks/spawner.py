"""Our JupyterHub spawner: DockerSpawner, told by the portal what to run on which GPU slice.

It runs inside the hub's process, so it imports nothing of Django: it asks the
portal's internal API for the session's launch spec (the container spec of
``sessions.runtime.spec``, JupyterLab's environment, the work volume) and
reports the session's moments back.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Awaitable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar

import requests
from dockerspawner import DockerSpawner, SwarmSpawner
from tornado import web
from tornado.httpclient import AsyncHTTPClient, HTTPClientError
from traitlets import Float, HasTraits, Integer, Unicode

from sessions.runtime.engine_client import api_client
from sessions.runtime.spec import HOST_NETWORK, ContainerSpec

HOME = "/home/jovyan/work"


async def _port_open(ip: str, port: int) -> bool:
    try:
        _, writer = await asyncio.open_connection(ip, port)
    except OSError:
        return False
    writer.close()
    return True


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _host_memory() -> int:
    """Bytes of memory of this host, whose engine runs the notebooks (as ``os.cpu_count`` its CPUs)."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


class PortalHandshake(HasTraits):
    """What every spawner of ours does with the portal, whatever runs the server (a Docker engine, a Swarm,
    Kubernetes): it asks the portal's internal API for the session's launch spec, refuses anything but the
    portal's session number from the hub's form, reports the session's moments back (in order, without holding
    up the launch), streams the launch's steps, and polls JupyterLab itself until it answers. Mixed in before
    the spawner class it serves (whose metaclass sets its traits up); JupyterHub's Spawner gives the rest."""

    # The Spawner's, as this mixin uses them.
    log: Any
    user: Any
    name: str
    server: Any
    start_timeout: int

    portal_url = Unicode("http://127.0.0.1:8002", help="The portal's own address (not the proxy).").tag(config=True)
    portal_token = Unicode("", help="The token shared with the portal (its hub service token).").tag(config=True)
    ready_poll_interval = Float(0.05, help="Seconds between checks that JupyterLab answers.").tag(config=True)
    report_patience = Float(
        60.0, help="Seconds a report to the portal is tried again while the portal does not answer."
    ).tag(config=True)
    _steps: list[tuple[int, str]]
    _starting = False
    session_id = 0

    def apply_user_options(self, spawner: Any, user_options: dict[str, Any]) -> None:
        # Everything that matters comes from the portal's spec; anything else sent here is refused.
        if set(user_options) - {"session"}:
            raise ValueError("Start sessions from the portal; only its session number is accepted here.")

    async def _portal(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        headers = {"Authorization": f"Bearer {self.portal_token}"}
        url = f"{self.portal_url.rstrip('/')}/internal/notebooks/{path}"
        return await asyncio.to_thread(requests.request, method, url, headers=headers, timeout=10, **kwargs)

    def _report_soon(self, event: str, details: Awaitable[dict[str, Any]] | None = None, **body: Any) -> None:
        """Report without holding up the launch; reports still reach the portal in order.

        ``details``, if given, is awaited in the background too and adds to the body.
        """
        previous = getattr(self, "_last_report", None)
        session_id = self.session_id  # the state may be cleared before this is sent

        async def send() -> None:
            if previous is not None:
                await asyncio.shield(previous)
            if details is not None:
                body.update(await details)
            await self._report(event, session_id, **body)

        self._last_report = asyncio.ensure_future(send())

    async def _report(self, event: str, session_id: int, **body: Any) -> None:
        """Send one report; a portal that does not answer (or answers 5xx) is asked again with a growing pause,
        for ``report_patience`` seconds. A start that is lost all the same is read back from the engine by the
        portal's reconciliation, so no session runs unbilled; a refusal (4xx) is final."""
        report = {"session": session_id, "user": self.user.name, "event": event, **body}
        pause, deadline = 0.5, time.monotonic() + self.report_patience
        while True:
            try:
                response = await self._portal("POST", "events", json=report)
            except requests.RequestException as error:
                why = str(error)
            else:
                if response.status_code < 500:
                    if response.status_code != 200:
                        self.log.warning("portal refused event %s: %s", event, response.text[:200])
                    return
                why = f"{response.status_code} {response.text[:200]}"
            if time.monotonic() + pause > deadline:
                self.log.warning("could not report %s to the portal, giving up: %s", event, why)
                return
            self.log.info("could not report %s to the portal (%s); trying again in %s s", event, why, pause)
            await asyncio.sleep(pause)
            pause = min(pause * 2, 10.0)

    async def _fetch_spec(self) -> dict[str, Any]:
        params = {"user": self.user.name, "server": self.name}
        try:
            response = await self._portal("GET", "launch-spec", params=params)
        except requests.RequestException as error:
            raise web.HTTPError(503, f"The portal did not answer: {error}") from None
        if response.status_code != 200:
            try:
                message = str(response.json().get("error", response.text[:200]))
            except ValueError:  # not the portal's JSON: a proxy's page, a host the portal does not serve
                message = f"the portal answered {response.status_code}: {response.text[:200]}"
            raise web.HTTPError(response.status_code, message)
        return dict(response.json())

    def _step(self, percent: int, message: str) -> None:
        """One step of the launch, for the hub's progress stream (its pages and the REST API)."""
        self._steps.append((percent, message))

    async def progress(self) -> Any:
        """The launch's steps as the hub streams them; each reader gets them all from the first."""
        shown = 0
        while True:
            steps = getattr(self, "_steps", [])
            for percent, message in steps[shown:]:
                yield {"progress": percent, "message": message}
            shown = len(steps)
            if not self._starting:
                return
            await asyncio.sleep(0.1)

    async def _wait_until_answering(self, ip: str, port: int) -> None:
        """Poll the server ourselves: the hub's random back-off costs seconds.

        On the event loop, not in threads: a refused connection costs next to nothing,
        and eight launches at once must not crowd the CPU their servers need to start.
        """
        url = f"http://{ip}:{port}{self.server.base_url if self.server else '/'}api"
        client = AsyncHTTPClient()
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if await _port_open(ip, port):
                try:
                    await client.fetch(url, request_timeout=2, raise_error=False)
                    return
                except (OSError, HTTPClientError):
                    pass  # open but not answering yet (or a timeout): try again
            await asyncio.sleep(self.ready_poll_interval)
        raise TimeoutError(f"JupyterLab did not answer within {self.start_timeout} s")


class PortalSpawner(PortalHandshake, DockerSpawner):
    docker_threads = Integer(16, help="Threads for Docker calls, shared by all launches.").tag(config=True)
    engine_tls_dir = Unicode(
        "",
        help="The CA, certificate and key a tcp:// engine of a GPU host is reached with (ca.pem, cert.pem, key.pem).",
    ).tag(config=True)

    _pool: ThreadPoolExecutor | None = None
    _engines: ClassVar[dict[str, Any]] = {}  # a docker.APIClient per engine
    engine = ""  # the Docker engine of the slice's host, as the launch spec names it; "": the hub's own
    _end: dict[str, Any]  # how the container ended, read in stop_object() before it is removed
    # DockerSpawner's traits, typed for our use of them (annotations only: the traits stay).
    network_name: str
    environment: dict[str, Any]

    @property
    def executor(self) -> ThreadPoolExecutor:
        # DockerSpawner's one shared thread makes every launch wait behind the slowest Docker call.
        cls = type(self)
        if cls._pool is None:
            cls._pool = ThreadPoolExecutor(self.docker_threads, thread_name_prefix="docker")
        return cls._pool

    @property
    def client(self) -> Any:
        """The Docker engine of the slice's host (DockerSpawner's one client for the hub's own engine)."""
        return self._client_of(self.engine)

    def _client_of(self, endpoint: str) -> Any:
        if not endpoint:
            return super().client
        found = self._engines.get(endpoint)
        if found is None:
            found = self._engines[endpoint] = api_client(endpoint, self.engine_tls_dir, **self.client_kwargs)
        return found

    def get_state(self) -> dict[str, Any]:
        state: dict[str, Any] = super().get_state()
        if self.session_id:
            state.update(session_id=self.session_id, port=self.port, network=self.network_name, engine=self.engine)
        return state

    def load_state(self, state: dict[str, Any]) -> None:
        super().load_state(state)
        self.session_id = int(state.get("session_id", 0))
        self.engine = str(state.get("engine", ""))  # a restarted hub stops the container on its own engine
        # As the launch spec set it (``_apply``): a hub restarted since must still remove the container it stops.
        if self.session_id:
            self.remove = True
        if "port" in state:
            self.port, self.network_name = int(state["port"]), str(state.get("network", self.network_name))
            self.use_internal_ip = self.network_name != HOST_NETWORK

    def clear_state(self) -> None:
        super().clear_state()
        self.session_id = 0

    def _apply(self, launch: dict[str, Any]) -> None:
        """The portal's launch spec onto DockerSpawner: the container spec as the portal built it, applied by
        the same code as the Docker adapter's (ContainerSpec.host_config), plus JupyterLab's environment."""
        self.session_id = int(launch["session"])
        self.engine = str(launch.get("engine", ""))
        spec = ContainerSpec.from_json(launch["container"])
        if not launch.get("sized_for_host"):  # no agent has told the portal its host's size: this machine's
            spec = spec.within_host(os.cpu_count(), _host_memory())
        self.image, self.network_name = spec.image, spec.network
        self.remove = True  # stop() removes it, after stop_object() has read how it ended
        # The limits are the host config's (NanoCpus); DockerSpawner's cpu_limit would add a CPU period
        # Docker refuses beside them. JupyterLab still reads them under JupyterHub's names.
        self.cpu_limit = None
        limits = {"CPU_LIMIT": str(spec.limits.cpus), "MEM_LIMIT": str(spec.limits.memory_bytes)}
        self.environment = {**self.environment, **limits, **launch["environment"]}
        self.volumes = {launch["volume"]: HOME}
        self.extra_create_kwargs = {"labels": dict(spec.labels)}
        host_config = spec.host_config()
        if self.network_name == HOST_NETWORK:
            # One port per server on the host's network; Docker must not publish ports there.
            self.ip, self.port = "127.0.0.1", free_port()
            host_config["port_bindings"] = None
        else:
            # On the portal's bridge: nothing published on the host, the proxy goes to the container's address.
            self.use_internal_ip = True
        self.extra_host_config = host_config

    async def get_ip_and_port(self) -> tuple[str, int]:
        if self.network_name == HOST_NETWORK:
            return "127.0.0.1", int(self.port)
        ip, port = await super().get_ip_and_port()
        return str(ip), int(port)

    async def start(self) -> tuple[str, int]:
        self._steps, self._starting = [], True
        try:
            self._step(10, "Slice allocated; asking the portal for the launch spec")
            self._apply(await self._fetch_spec())
            self._step(
                30, f"Creating the container on {', '.join(self.extra_host_config['device_requests'][0]['device_ids'])}"
            )
            self._report_soon("progress", message="Creating the container")
            try:
                ip, port = await super().start()
                # The engine's start moment is read while JupyterLab boots, not before we wait for it.
                self._report_soon("container_started", self._started_at(), container_id=self.container_id)
                self._step(60, "Container started; waiting for JupyterLab to answer")
                await self._wait_until_answering(ip, port)
            except Exception as error:
                self._report_soon("failed", message=str(error))
                raise
            self._step(90, "JupyterLab answers")
            self._report_soon("ready")
            return ip, port
        finally:
            self._starting = False

    async def _container_state(self) -> dict[str, Any]:
        """The engine's own record of the container: when it started and ended (what billing charges by)."""
        try:
            found = await self.docker("inspect_container", self.container_id)
        except Exception as error:  # gone already: the portal reads the engine's event log instead
            self.log.info("could not inspect %s: %s", self.container_id[:12], error)
            return {}
        return dict(found.get("State", {}))

    async def _started_at(self) -> dict[str, Any]:
        return {"at": (await self._container_state()).get("StartedAt", "")}

    async def stop_object(self) -> None:
        await super().stop_object()
        state = await self._container_state() if self.container_id else {}
        self._end = {
            "at": state.get("FinishedAt", ""),
            "exit_code": state.get("ExitCode"),
            "oom_killed": bool(state.get("OOMKilled")),
        }

    async def stop(self, now: bool = False) -> None:
        session_id = self.session_id  # DockerSpawner clears state when it removes the container
        self._end = {}
        await super().stop(now=now)
        if session_id:
            self.session_id = session_id
            self._report_soon("stopped", **self._end)


SWARM_ENDED = {"complete", "shutdown", "failed", "rejected", "orphaned", "remove"}


class PortalSwarmSpawner(PortalSpawner, SwarmSpawner):
    """The notebook server as a Swarm service pinned to the node of the host the allocator chose (issue 32):
    the same launch spec, limits, labels and reports as ``PortalSpawner``'s containers, with what a service
    cannot carry on Docker 20.10 made up for (``ContainerSpec.service_parts``). Swarm never restarts it (the
    portal decides); the wait for its task neither backs off nor takes a rejected task for a pending one.

    The server's port is published on its node's own address (host mode), where the hub's proxy reaches it:
    the hub need not be a task on an overlay, only routed to the nodes. Services are asked of a Swarm manager
    (``swarm_manager``); the container's own moments (start, end, exit code) of the host's engine, as the
    launch spec names it."""

    swarm_manager = Unicode("", help="A Swarm manager's Docker endpoint; empty: the hub's own engine.").tag(config=True)
    task_poll_interval = Float(0.1, help="Seconds between looks at the service's task while it starts.").tag(
        config=True
    )
    host = ""  # the GPU host, which is its Swarm node's hostname

    @property
    def client(self) -> Any:
        return self._client_of(self.swarm_manager)

    def _apply(self, launch: dict[str, Any]) -> None:
        super()._apply(launch)
        self.host = str(launch["host"])
        parts = ContainerSpec.from_json(launch["container"]).service_parts()
        self.environment = {**self.environment, **parts["env"]}
        self.extra_container_spec = parts["container"]
        limits = {"NanoCPUs": parts["resources"]["cpu_limit"], "MemoryBytes": parts["resources"]["mem_limit"]}
        self.extra_task_spec = {
            "resources": {"Limits": {**limits, "Pids": parts["pids"]}},
            "restart_policy": {"Condition": "none"},
            "log_driver": {"Name": parts["log_driver"]["name"], "Options": parts["log_driver"]["options"]},
        }
        self.extra_endpoint_spec = {"ports": [{"TargetPort": self.port, "Protocol": "tcp", "PublishMode": "host"}]}
        self.network_name, self.use_internal_ip = "", False  # the node's own bridge; the port on its address

    @property
    def mounts(self) -> list[dict[str, Any]]:
        return [
            {"Type": "volume", "Source": source, "Target": bind["bind"]} for source, bind in self.volume_binds.items()
        ]

    def get_state(self) -> dict[str, Any]:
        state = super().get_state()
        if self.session_id:
            state.update(host=self.host)
        return state

    def load_state(self, state: dict[str, Any]) -> None:
        super().load_state(state)
        self.host = str(state.get("host", ""))
        self.use_internal_ip = False

    async def create_object(self) -> Any:
        self.extra_placement_spec = {"constraints": [f"node.id=={await self._node_id()}"]}
        return await super().create_object()

    async def _node_id(self) -> str:
        """The Swarm node whose hostname is the host's, if it can take work; else why not, naming it."""
        nodes = [n for n in await self.docker("nodes") if n["Description"]["Hostname"] == self.host]
        if not nodes:
            raise RuntimeError(f"No Swarm node is named {self.host}: the GPU host is not in the Swarm.")
        node = nodes[0]
        state, availability = node["Status"]["State"], node["Spec"].get("Availability", "active")
        if state in ("down", "disconnected") or availability != "active":  # "unknown": a manager just elected
            raise RuntimeError(f"The Swarm node {self.host} is {state} and {availability}: it takes no new work.")
        return str(node["ID"])

    async def start_object(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        while True:
            task = await self.get_task()
            if task is None:
                raise RuntimeError(f"The service {self.service_name} has no task.")
            status = task["Status"]
            if status["State"] == "running":
                return
            if status["State"] in SWARM_ENDED or task.get("DesiredState") in SWARM_ENDED:
                why = status.get("Err") or await self._given_up(task) or status.get("Message") or status["State"]
                await self._remove_unstarted()
                raise RuntimeError(f"Swarm did not start the server on {self.host} ({status['State']}): {why}")
            if time.monotonic() > deadline:
                await self._remove_unstarted()
                raise TimeoutError(f"The server's task on {self.host} did not run within {self.start_timeout} s")
            await asyncio.sleep(self.task_poll_interval)

    async def _given_up(self, task: dict[str, Any]) -> str:
        """Why Swarm gave up a task that never ran: its node went down (a dead engine, a cut link) and, as
        nothing may restart the server, Swarm shut the task down; it would wait for the node for ever."""
        if task.get("DesiredState") not in SWARM_ENDED or not task.get("NodeID"):
            return ""
        try:
            node = await self.docker("inspect_node", task["NodeID"])
        except Exception:  # the reason stays Swarm's own
            return ""
        state = node.get("Status", {}).get("State", "")
        return f"its node is {state}: Swarm gave the task up before it ran" if state != "ready" else ""

    async def _remove_unstarted(self) -> None:
        """A server that never ran leaves nothing behind: its service goes, and Swarm removes its task's
        container with it (nothing stops it later: the hub forgets a server whose start failed)."""
        try:
            await self.remove_object()
        except Exception as error:  # the launch fails with its own reason; the portal's reconciliation sweeps
            self.log.warning("could not remove the service %s of a failed start: %s", self.service_name, error)

    async def get_ip_and_port(self) -> tuple[str, int]:
        task = await self.get_task()
        if task is None:
            raise RuntimeError(f"The service {self.service_name} has no task.")
        ports = task["Status"].get("PortStatus", {}).get("Ports", [])
        published = [p["PublishedPort"] for p in ports if p.get("TargetPort") == self.port]
        if not published:
            raise RuntimeError(f"The service {self.service_name} publishes no port for {self.port}.")
        node = await self.docker("inspect_node", task["NodeID"])
        return str(node["Status"]["Addr"]), int(published[0])

    async def _task_container(self) -> str:
        task = await self.get_task() if self.service_id else None
        return str((task or {}).get("Status", {}).get("ContainerStatus", {}).get("ContainerID", ""))

    async def _started_at(self) -> dict[str, Any]:
        """The start as the portal hears of it: the engine's moment and the task's container (not the service)."""
        return {**await super()._started_at(), "container_id": await self._task_container()}

    async def _container_state(self) -> dict[str, Any]:
        """The task's container as its host's engine records it (the engine's moments, as billing wants)."""
        container = await self._task_container()
        if not container:
            return {}
        try:
            found = await asyncio.wrap_future(
                self.executor.submit(self._client_of(self.engine).inspect_container, container)
            )
        except Exception as error:  # gone already: the portal reads the engine's event log instead
            self.log.info("could not inspect %s on %s: %s", container[:12], self.host, error)
            return {}
        return dict(found.get("State", {}))

    async def stop_object(self) -> None:
        """Stop the task and wait for its end (a service has no stop of its own: none wanted, it is ended), so
        its container's end can be read before ``remove_object`` removes the service with it."""
        if self.service_id:
            service = await self.get_object()
            if service is not None:
                version = service["Version"]["Index"]
                await self.docker(
                    "update_service",
                    self.service_id,
                    version,
                    mode={"Replicated": {"Replicas": 0}},
                    fetch_current_spec=True,
                )
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline:
                    task = await self.get_task()
                    if task is None or task["Status"]["State"] in SWARM_ENDED:
                        break
                    await asyncio.sleep(self.task_poll_interval)
        await super().stop_object()
