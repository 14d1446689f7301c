"""A stand-in for the Job controller and the kubelet of render runs (issue 34, item 2), on the in-memory API server
(tests/kube/cluster.py): no cluster can run here, so this runs what a node would, for real. Each new Job gets a
pod; its containers run as the pod spec says: the ``fetch`` init container and the ``give-back`` sidecar as
processes of the portal's code (``python -m sessions.render.podfiles``, their volumes folders of this machine),
Blender as a container of the render image on the Docker engine, with the spec's command, user, read-only root,
no network and no capabilities. The pod's and the Job's status follow each step as the kubelet and the Job
controller report them; Blender's output is the pod's log, served as it comes (``follow``); a Job whose deadline
passes has Blender killed. What is not the cluster's: the scheduler (every pod fits), and the volumes' size limits
(no eviction)."""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import signal
import sys
import tempfile
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes_asyncio.client import ApiClient, BatchV1Api, Configuration, CoreV1Api, ResourceV1Api

from tests.helpers.processes import ROOT

DOCKER = "/usr/bin/docker"
JOB_NAME = "batch.kubernetes.io/job-name"


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class PodLogs:
    """What each pod's containers printed, and which of them ended: the API server serves it."""

    def __init__(self) -> None:
        self.lines: dict[tuple[str, str], list[bytes]] = defaultdict(list)
        self.ended: set[tuple[str, str]] = set()


LOGS = PodLogs()


class JobKubelet:
    """Runs every Job of ``namespace`` created on the API server at ``url``, one pod each."""

    def __init__(self, url: str, namespace: str, logs: PodLogs) -> None:
        self.url, self.namespace, self.logs = url, namespace, logs
        self.seen: set[str] = set()
        self.running: list[asyncio.Task[None]] = []
        self.folders: list[Path] = []
        self.claims: dict[str, dict[str, Any]] = {}  # each Job's pod's claim, as the kubelet found it (DRA)

    async def serve(self, stop: asyncio.Event) -> None:
        async with ApiClient(Configuration(host=self.url)) as client:
            batch = BatchV1Api(client)
            while not stop.is_set():
                for job in (await batch.list_namespaced_job(self.namespace)).items:
                    raw = client.sanitize_for_serialization(job)
                    if raw["metadata"]["name"] not in self.seen:
                        self.seen.add(raw["metadata"]["name"])
                        self.running.append(asyncio.ensure_future(self._run(client, raw)))
                await asyncio.sleep(0.1)
            for task in self.running:
                task.cancel()
            await asyncio.gather(*self.running, return_exceptions=True)
        for folder in self.folders:
            shutil.rmtree(folder, ignore_errors=True)

    async def _run(self, client: ApiClient, job: dict[str, Any]) -> None:
        core, batch = CoreV1Api(client), BatchV1Api(client)
        name = job["metadata"]["name"]
        template = job["spec"]["template"]
        pod_name = f"{name}-{secrets.token_hex(3)}"
        labels = {**template["metadata"]["labels"], JOB_NAME: name, "job-name": name}
        pod: Any = {"metadata": {"name": pod_name, "labels": labels}, "spec": template["spec"]}
        await core.create_namespaced_pod(self.namespace, pod)
        await batch.patch_namespaced_job(name, self.namespace, {"status": {"startTime": now(), "active": 1}})
        spec = template["spec"]
        for reference in spec.get("resourceClaims", []):  # the device the claim selects is prepared for the pod
            found: Any = await ResourceV1Api(client).read_namespaced_resource_claim(
                reference["resourceClaimName"], self.namespace
            )
            self.claims[name] = client.sanitize_for_serialization(found)
        folder = Path(tempfile.mkdtemp(prefix="gpu-portal-kubelet-", dir="/var/tmp"))
        self.folders.append(folder)
        volumes = await self._volumes(core, spec, folder)
        (fetch, give_back), (blender,) = spec["initContainers"], spec["containers"]
        status: dict[str, Any] = {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "True"}]}

        async def report(**changed: Any) -> None:
            status.update(changed)
            await core.patch_namespaced_pod(pod_name, self.namespace, {"status": dict(status)})

        await report(initContainerStatuses=[_running("fetch")])
        fetched, said = await self._process(fetch, volumes, folder)
        if fetched != 0:
            ended = _terminated("fetch", fetched, said)
            await report(phase="Failed", initContainerStatuses=[ended])
            await self._ended(batch, name, "Failed", "the fetch container failed")
            return
        sidecar = await self._start_process(give_back, volumes, folder)
        await report(
            phase="Running",
            initContainerStatuses=[_terminated("fetch", 0, ""), _running("give-back")],
            containerStatuses=[_running("blender")],
        )
        exit_code, oom, started, why = await self._blender(batch, name, pod_name, blender, volumes, job)
        finished = now()
        blender_ended = _terminated("blender", exit_code, "", oom=oom, started=started, finished=finished)
        await report(containerStatuses=[blender_ended])
        sidecar.send_signal(signal.SIGTERM)  # the main container ended: the kubelet ends the sidecar
        out, err = await sidecar.communicate()
        self.logs.lines[(pod_name, "give-back")].extend((out + err).splitlines())
        self.logs.ended.add((pod_name, "give-back"))
        phase = "Succeeded" if exit_code == 0 else "Failed"
        gave_back = _terminated("give-back", sidecar.returncode or 0, err.decode(errors="replace"))
        await report(phase=phase, initContainerStatuses=[_terminated("fetch", 0, ""), gave_back])
        await self._ended(batch, name, "Complete" if phase == "Succeeded" else "Failed", why)
        if why == "DeadlineExceeded":  # the Job controller deletes a Job's active pods past its deadline
            await core.delete_namespaced_pod(pod_name, self.namespace)

    async def _volumes(self, core: CoreV1Api, spec: dict[str, Any], folder: Path) -> dict[str, Path]:
        """Each volume of the pod as a folder here; the Secret's values as files."""
        found: dict[str, Path] = {}
        for volume in spec["volumes"]:
            path = folder / volume["name"]
            path.mkdir(mode=0o777)
            path.chmod(0o777)  # Blender's user writes /out (fsGroup's part)
            if "secret" in volume:
                secret: Any = await core.read_namespaced_secret(volume["secret"]["secretName"], self.namespace)
                for key, value in (secret.string_data or {}).items():
                    (path / key).write_text(value)
            found[volume["name"]] = path
        return found

    def _mapped(self, container: dict[str, Any], volumes: dict[str, Path]) -> tuple[list[str], dict[str, str]]:
        """A file container's command and environment with its mount paths as this machine's folders."""
        mounts = {mount["mountPath"]: volumes[mount["name"]] for mount in container["volumeMounts"]}

        def here(value: str) -> str:
            for inside, outside in mounts.items():
                if value == inside or value.startswith(f"{inside}/"):
                    return str(outside) + value[len(inside) :]
            return value

        command = [here(part) for part in container["command"]]
        env = {item["name"]: here(item["value"]) for item in container.get("env", [])}
        return command, env

    async def _start_process(
        self, container: dict[str, Any], volumes: dict[str, Path], folder: Path
    ) -> asyncio.subprocess.Process:
        command, env = self._mapped(container, volumes)
        assert command[:3] == ["python", "-m", "sessions.render.podfiles"], command
        env = {"PATH": os.environ["PATH"], **env, "GPU_PORTAL_TERMINATION_LOG": str(folder / container["name"])}
        return await asyncio.create_subprocess_exec(
            sys.executable, *command[1:], env=env, cwd=ROOT, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip

    async def _process(self, container: dict[str, Any], volumes: dict[str, Path], folder: Path) -> tuple[int, str]:
        process = await self._start_process(container, volumes, folder)
        await process.communicate()
        message = folder / container["name"]
        return process.returncode or 0, message.read_text() if message.exists() else ""

    async def _blender(
        self,
        batch: BatchV1Api,
        job_name: str,
        pod_name: str,
        container: dict[str, Any],
        volumes: dict[str, Path],
        job: dict[str, Any],
    ) -> tuple[int, bool, str, str]:
        """Blender's container on the Docker engine, its output the pod's log; killed past the Job's deadline."""
        security, limits = container["securityContext"], container["resources"]["limits"]
        cpus = min(float(limits["cpu"]), float(os.cpu_count() or 1))
        memory = min(int(limits["memory"]), 4 * 1024**3)
        name = f"gpu-portal-kubelet-{pod_name}"
        docker = [DOCKER, "run", "--name", name, "--network", "none", "--read-only", "--cap-drop", "ALL"]
        docker += ["--security-opt", "no-new-privileges", "--user", f"{security['runAsUser']}:{security['runAsGroup']}"]
        docker += ["--cpus", f"{cpus:g}", "--memory", str(memory), "--workdir", container["workingDir"]]
        for mount in container["volumeMounts"]:
            if mount["mountPath"] == "/tmp":  # noqa: S108 (the pod's memory volume)
                docker += ["--tmpfs", "/tmp:rw,size=512m,mode=1777"]  # noqa: S108
            else:
                mode = "ro" if mount.get("readOnly") else "rw"
                docker += ["-v", f"{volumes[mount['name']]}:{mount['mountPath']}:{mode}"]
        for item in container.get("env", []):
            docker += ["-e", f"{item['name']}={item['value']}"]
        started = now()
        process = await asyncio.create_subprocess_exec(
            *docker, container["image"], *container["command"],
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        deadline = asyncio.ensure_future(self._deadline(batch, job_name, name))
        assert process.stdout is not None
        key = (pod_name, "blender")
        while line := await process.stdout.readline():
            self.logs.lines[key].append(line.rstrip(b"\n"))
        exit_code = await process.wait()
        deadline.cancel()
        inspected = await asyncio.create_subprocess_exec(
            DOCKER, "inspect", "--format", "{{.State.OOMKilled}}", name, stdout=asyncio.subprocess.PIPE
        )
        oom = (await inspected.communicate())[0].strip() == b"true"
        await (await asyncio.create_subprocess_exec(DOCKER, "rm", "-f", name, stdout=asyncio.subprocess.DEVNULL)).wait()
        self.logs.ended.add(key)
        why = "DeadlineExceeded" if deadline.done() and not deadline.cancelled() else ""
        return exit_code, oom, started, why

    async def _deadline(self, batch: BatchV1Api, job_name: str, container: str) -> None:
        """The Job controller's deadline: Blender killed once the Job ran past it (a patched deadline too)."""
        began = asyncio.get_running_loop().time()
        while True:
            job: Any = await batch.read_namespaced_job(job_name, self.namespace)
            if asyncio.get_running_loop().time() - began > job.spec.active_deadline_seconds:
                quiet = asyncio.subprocess.DEVNULL
                await (await asyncio.create_subprocess_exec(DOCKER, "kill", container, stdout=quiet)).wait()
                return
            await asyncio.sleep(0.2)

    async def _ended(self, batch: BatchV1Api, name: str, condition: str, reason: str) -> None:
        state = {"type": condition, "status": "True", "reason": reason or condition}
        counts = {"succeeded": 1} if condition == "Complete" else {"failed": 1}
        patch = {"status": {"conditions": [state], "active": 0, **counts}}
        await batch.patch_namespaced_job(name, self.namespace, patch)


def _running(name: str) -> dict[str, Any]:
    return {"name": name, "ready": True, "restartCount": 0, "image": "", "imageID": "",
            "state": {"running": {"startedAt": now()}}}  # fmt: skip


def _terminated(
    name: str, exit_code: int, message: str, *, oom: bool = False, started: str = "", finished: str = ""
) -> dict[str, Any]:
    reason = "OOMKilled" if oom else ("Completed" if exit_code == 0 else "Error")
    ended = {"exitCode": exit_code, "reason": reason, "message": message, "startedAt": started or now(),
             "finishedAt": finished or now()}  # fmt: skip
    return {"name": name, "ready": False, "restartCount": 0, "image": "", "imageID": "", "state": {"terminated": ended}}
