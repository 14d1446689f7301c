"""A render run as a Kubernetes Job, followed as the render sandbox follows a container
(``sessions.runtime.sandbox``): the portal's render worker makes the run's objects (``sessions.runtime.kube.jobs``)
through the cluster's API, reads Blender's lines from its container's log as they come, and takes how it ended
from the pod's status once the give-back sidecar has brought the frames to the portal.

- ``start``: the run's objects created in order (its Secret, its claim with DRA, its Job), then the Job's pod
  waited for until Blender's container runs (the moment the meter charges from). A pod the scheduler cannot
  place, or whose scene could not be fetched, fails the start with the cluster's words, and nothing is left.
- ``kill``: the Job's deadline brought to now; the Job controller stops its pod, the sidecar still gives back
  what was saved.
- ``exit_of``: Blender's container's end (exit code, out of memory), once the pod ended.
- ``remove``: the Job (its pod with it), the Secret and the run's own claim.

A run is named by its Job's name, as a container by its id; ``containers_for`` lists them by the portal's labels.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterator
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from kubernetes_asyncio import config
from kubernetes_asyncio.client import ApiClient, ApiException, BatchV1Api, Configuration, CoreV1Api, ResourceV1Api

from sessions.runtime.docker import ContainerState, RuntimeError_
from sessions.runtime.kube.pods import namespace_of, state_of
from sessions.runtime.kube.slices import own_claim
from sessions.runtime.spec import INSTANCE_LABEL, LABEL_PREFIX, ContainerSpec

log = logging.getLogger(__name__)
BLENDER = "blender"
FETCH = "fetch"
GIVE_BACK = "give-back"
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
POLL_S = 0.5
START_TIMEOUT_S = 600  # an image pulled, a scene fetched: past this, the run did not start
LONGEST_LINE = 64 * 1024
Make = Callable[[ContainerSpec, list[str]], list[dict[str, Any]]]


def configuration() -> Configuration:
    """The cluster's API: PORTAL_KUBERNETES_API, or the cluster this program runs in (its service account)."""
    if settings.KUBERNETES_API:
        return Configuration(host=settings.KUBERNETES_API)
    found = Configuration()
    config.load_incluster_config(client_configuration=found)  # type: ignore[no-untyped-call]
    return found


class JobRuntime:
    """One namespace's render runs. ``make`` gives a run's objects, in order, from the sandbox's spec and
    command (``sessions.render.kubejobs``); ``on_started`` and ``may_start`` are the render worker's, as for a
    container (``sessions.render.containers.Watched``)."""

    files_here = False

    def __init__(
        self,
        endpoint: str,
        make: Make | None = None,
        on_started: Callable[[datetime | None], None] | None = None,
        may_start: Callable[[], bool] | None = None,
    ) -> None:
        self.namespace = namespace_of(endpoint)
        self.make, self.on_started, self.may_start = make, on_started, may_start
        self.container_id: str | None = None
        self.started_at: datetime | None = None
        self.ended: ContainerState | None = None
        self._killed: dict[str, datetime] = {}  # runs stopped here, and when

    @property
    def finished_at(self) -> datetime | None:
        return self.ended.finished_at if self.ended is not None else None

    # -- the API

    def _call(self, work: Callable[[ApiClient], Awaitable[Any]]) -> Any:
        async def run() -> Any:
            async with ApiClient(configuration()) as client:
                return await work(client)

        try:
            return asyncio.run(run())
        except (ApiException, config.ConfigException) as error:
            raise RuntimeError_(f"the Kubernetes API of namespace {self.namespace}: {_said(error)}") from None

    def _pod(self, name: str) -> dict[str, Any] | None:
        """The Job's pod (the newest, should the controller have made another), as the API gives it."""

        async def found(client: ApiClient) -> dict[str, Any] | None:
            listed = await CoreV1Api(client).list_namespaced_pod(
                self.namespace, label_selector=f"{JOB_NAME_LABEL}={name}", _request_timeout=10
            )
            pods = [client.sanitize_for_serialization(pod) for pod in listed.items]
            pods = [pod for pod in pods if (pod["metadata"].get("labels") or {}).get(JOB_NAME_LABEL) == name]
            pods.sort(key=lambda pod: str(pod["metadata"].get("creationTimestamp") or ""))
            return pods[-1] if pods else None

        return self._call(found)  # type: ignore[no-any-return]

    # -- the sandbox

    def start(self, spec: ContainerSpec, command: list[str], **overrides: Any) -> str:
        if self.make is None:
            raise RuntimeError_("this namespace's runtime was made to stop runs, not to start them")
        if self.may_start is not None and not self.may_start():
            raise RuntimeError_("not started: what it was for ended meanwhile")
        made = self.make(spec, command)
        name = str(made[-1]["metadata"]["name"])
        self.container_id = name
        try:
            self._create(made)
            pod = self._wait_for_blender(name)
            self.started_at = state_of(pod, BLENDER).started_at
            if self.on_started is not None:
                self.on_started(self.started_at)
        except Exception:  # never a run going on that nobody follows, nor half of one made
            with contextlib.suppress(RuntimeError_):  # the API away: what was made stays, its token expiring
                self.remove(name)
            raise
        return name

    def _create(self, made: list[dict[str, Any]]) -> None:
        async def created(client: ApiClient) -> None:
            for item in made:
                manifest: Any = item  # sent as it is: a plain dictionary in the API's shape
                kind = manifest["kind"]
                if kind == "Secret":
                    await CoreV1Api(client).create_namespaced_secret(self.namespace, manifest, _request_timeout=10)
                elif kind == "ResourceClaim":
                    try:
                        await ResourceV1Api(client).create_namespaced_resource_claim(
                            self.namespace, manifest, _request_timeout=10
                        )
                    except ApiException as error:
                        if error.status != 409:  # a share's claim is its GPU's: another tenant made it
                            raise
                else:
                    await BatchV1Api(client).create_namespaced_job(self.namespace, manifest, _request_timeout=10)

        self._call(created)

    def _wait_for_blender(self, name: str) -> dict[str, Any]:
        """The pod once Blender's container runs (or already ended); RuntimeError_ with the cluster's words if
        it never will."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            pod = self._pod(name)
            if pod is not None:
                blender = state_of(pod, BLENDER)
                if blender.started_at is not None:
                    return pod
                refusal = _never_starts(pod)
            else:  # none yet, or none any more: the Job may have ended without one (its deadline, a stop)
                refusal = self._job_failed(name)
            if refusal:
                raise RuntimeError_(refusal)
            time.sleep(POLL_S)
        raise RuntimeError_(f"the render run {name} did not start within {START_TIMEOUT_S} s")

    def _job_failed(self, name: str) -> str:
        """Why the run's Job failed, in the cluster's words; empty while it has not (or is gone)."""

        async def read(client: ApiClient) -> str:
            try:
                job = await BatchV1Api(client).read_namespaced_job(name, self.namespace, _request_timeout=10)
            except ApiException as error:
                if error.status == 404:
                    return f"the render run {name} is gone"
                raise
            for condition in (job.status.conditions if job.status else None) or []:
                if condition.type == "Failed" and condition.status == "True":
                    return f"the render run ended before Blender started: {condition.message or condition.reason}"
            return ""

        return self._call(read)  # type: ignore[no-any-return]

    def output_lines(self, container_id: str) -> Iterator[str]:
        """Blender's container's log, line by line as it comes, until it ends (the API's follow)."""
        pod = self._pod(container_id)
        if pod is None:
            raise RuntimeError_(f"the render run {container_id} has no pod")
        loop = asyncio.new_event_loop()
        lines = self._followed(pod["metadata"]["name"])
        try:
            while True:
                try:
                    yield loop.run_until_complete(lines.__anext__())
                except StopAsyncIteration:
                    return
                except (TimeoutError, ApiException, OSError) as error:
                    raise RuntimeError_(f"reading the log of render run {container_id} failed: {error}") from None
        finally:
            loop.run_until_complete(lines.aclose())
            loop.close()

    async def _followed(self, pod: str) -> AsyncGenerator[str, None]:
        async with ApiClient(configuration()) as client:
            answer: Any = await CoreV1Api(client).read_namespaced_pod_log(
                pod, self.namespace, container=BLENDER, follow=True, _preload_content=False
            )
            pending = b""
            async for chunk in answer.content.iter_any():
                pending += chunk
                *whole, pending = pending.split(b"\n")
                while len(pending) > LONGEST_LINE:  # a program cannot make us hold more
                    whole.append(pending[:LONGEST_LINE])
                    pending = pending[LONGEST_LINE:]
                for line in whole:
                    yield line.decode(errors="replace")
            if pending:
                yield pending.decode(errors="replace")

    def kill(self, container_id: str) -> bool:
        """The Job's deadline brought to now: its pod is stopped (the sidecar gives back what was saved).
        False if the run had ended or is gone."""
        pod = self._pod(container_id)
        if pod is None or state_of(pod, BLENDER).finished_at is not None:
            return False

        async def stopped(client: ApiClient) -> None:
            patch = {"spec": {"activeDeadlineSeconds": 1}}
            await BatchV1Api(client).patch_namespaced_job(container_id, self.namespace, patch, _request_timeout=10)

        try:
            self._call(stopped)
        except RuntimeError_ as error:
            log.info("render run %s: not stopped: %s", container_id, error)
            return False
        self._killed[container_id] = datetime.now(UTC)
        return True

    def exit_of(self, container_id: str, timeout: float = 30) -> ContainerState:
        """Blender's end as the kubelet recorded it, once the pod ended (the frames given back by then: the
        pod ends after its sidecar). Blender's container has ended when this is asked (its log ended), so
        ``timeout`` is the sidecar's: its grace period at most."""
        deadline = time.monotonic() + max(timeout, 300)
        while time.monotonic() < deadline:
            pod = self._pod(container_id)
            if pod is None and container_id in self._killed:  # the Job controller deleted it past its deadline
                self.ended = ContainerState(False, self._killed[container_id], 137, False, self.started_at)
                return self.ended
            if pod is None:
                raise RuntimeError_(f"the render run {container_id} has no pod")
            blender = state_of(pod, BLENDER)
            if blender.finished_at is not None and (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                self.ended = blender
                return blender
            time.sleep(POLL_S)
        raise RuntimeError_(f"the render run {container_id} did not end within {timeout:g} s")

    def remove(self, container_id: str) -> None:
        """The Job (its pod with it), its Secret and its own claim (with DRA; a share's claim is its GPU's)."""

        async def removed(client: ApiClient) -> None:
            calls = [
                BatchV1Api(client).delete_namespaced_job(
                    container_id, self.namespace, propagation_policy="Background", _request_timeout=10
                ),
                CoreV1Api(client).delete_namespaced_secret(container_id, self.namespace, _request_timeout=10),
                ResourceV1Api(client).delete_namespaced_resource_claim(
                    own_claim(container_id), self.namespace, _request_timeout=10
                ),
            ]
            for call in calls:
                try:
                    await call
                except ApiException as error:
                    if error.status != 404:  # never made (no DRA), or gone already
                        raise

        self._call(removed)

    def containers_for(self, label: str, value: str | None = None) -> list[str]:
        """This portal's runs (Jobs) carrying a label (with this value, if given)."""
        key = f"{LABEL_PREFIX}.{label}"
        selector = f"{INSTANCE_LABEL}={settings.INSTANCE_ID},{key}" + (f"={value}" if value is not None else "")

        async def listed(client: ApiClient) -> list[str]:
            jobs = await BatchV1Api(client).list_namespaced_job(
                self.namespace, label_selector=selector, _request_timeout=10
            )
            found = []
            for job in jobs.items:  # checked here too: another portal's run is never touched
                labels = job.metadata.labels or {}
                mine = labels.get(INSTANCE_LABEL) == settings.INSTANCE_ID and key in labels
                if mine and (value is None or labels[key] == value):
                    found.append(str(job.metadata.name))
            return found

        return self._call(listed)  # type: ignore[no-any-return]

    def state(self, container_id: str) -> ContainerState | None:
        """Blender's container's state in the run's pod; None once the run (or its pod) is gone."""
        pod = self._pod(container_id)
        return state_of(pod, BLENDER) if pod is not None else None

    def labels_of(self, container_id: str) -> dict[str, str]:
        """The portal's labels on a run's Job; empty once it is gone."""

        async def read(client: ApiClient) -> dict[str, str]:
            try:
                job = await BatchV1Api(client).read_namespaced_job(container_id, self.namespace, _request_timeout=10)
            except ApiException as error:
                if error.status == 404:
                    return {}
                raise
            return dict(job.metadata.labels or {})

        return self._call(read)  # type: ignore[no-any-return]

    def within_host(self, spec: ContainerSpec) -> ContainerSpec:
        return spec  # the node's allocatable is the scheduler's to check; the allocator sized the slice

    def host_cpus(self) -> int | None:
        return None

    def run_briefly(self, image: str, command: list[str], user: str, volumes: dict[str, dict[str, str]]) -> int:
        raise RuntimeError_("a render run on Kubernetes mounts no folder of this machine")


def _never_starts(pod: dict[str, Any]) -> str:
    """Why a pod will not run Blender, in the cluster's words: the scheduler cannot place it, its scene could
    not be fetched, or it ended before Blender started; empty while it may still."""
    status = pod.get("status") or {}
    for condition in status.get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("reason") == "Unschedulable":
            return f"the cluster cannot place the render run: {condition.get('message') or 'unschedulable'}"
    for container in status.get("initContainerStatuses") or []:
        ended = (container.get("state") or {}).get("terminated") or {}
        if container.get("name") == FETCH and ended and ended.get("exitCode"):
            return f"the run's scene could not be fetched: {(ended.get('message') or '').strip() or 'it failed'}"
    if status.get("phase") in ("Failed", "Succeeded"):
        return f"the render run's pod ended before Blender started: {status.get('message') or status.get('reason')}"
    return ""


def _said(error: Exception) -> str:
    if isinstance(error, ApiException) and error.status:
        return f"{error.status} {error.reason}"
    return str(error)
