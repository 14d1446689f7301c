"""The portal's reconciliation against pods listed by label (issue 34): a GPU host whose engine is
``kube://NAMESPACE`` has its notebook servers followed as that namespace's pods carrying this portal's instance
label, through the in-memory API server (tests/kube/cluster.py). A running pod is its session's proof of life;
a session whose pod is gone ends, at its last proof of life; a pod of an ended session is deleted; another
portal's pod is never touched; an API that does not answer confirms nothing and changes nothing."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.contrib.auth.models import User
from kubernetes_asyncio.client import ApiClient, Configuration, CoreV1Api

from sessions.gpus import holdings
from sessions.gpus.allocator import SliceRequest
from sessions.gpus.models import Slice
from sessions.notebooks.models import NotebookImage, NotebookSession
from sessions.notebooks.reconcile import reconcile
from tests.factories import running_session
from tests.kube.cluster import NAMESPACE, Cluster, in_thread

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]


def pod(name: str, session: int, instance: str, running: bool = True) -> dict[str, Any]:
    """A notebook server's pod as KubeSpawner makes it and a kubelet runs it (the labels ours carry)."""
    started = (datetime.now(UTC) - timedelta(minutes=3)).strftime("%Y-%m-%dT%H:%M:%SZ")
    state = {"running": {"startedAt": started}} if running else {}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"gpu-portal.instance": instance, "gpu-portal.session": str(session)}},
        "spec": {"containers": [{"name": "notebook", "image": "gpu-portal/notebook:latest"}]},
        "status": {
            "phase": "Running" if running else "Pending",
            "containerStatuses": [
                {"name": "notebook", "ready": running, "restartCount": 0, "image": "", "imageID": "", "state": state}
            ],
        },
    }  # fmt: skip


async def pods_named(cluster: Cluster) -> set[str]:
    async with ApiClient(Configuration(host=cluster.url)) as client:
        return {item.metadata.name for item in (await CoreV1Api(client).list_namespaced_pod(NAMESPACE)).items}


async def create(cluster: Cluster, *manifests: dict[str, Any]) -> None:
    async with ApiClient(Configuration(host=cluster.url)) as client:
        for manifest in manifests:
            await CoreV1Api(client).create_namespaced_pod(NAMESPACE, manifest)  # type: ignore[arg-type]  # sent as is


def sessions(owner: User) -> tuple[NotebookSession, NotebookSession, NotebookSession]:
    image, _ = NotebookImage.objects.get_or_create(name="JupyterLab", defaults={"image": "gpu-portal/notebook:latest"})
    alive = running_session(owner, image, SliceRequest("mig", "1g.10gb", host="gpu-node-2"), "alive")
    gone = running_session(owner, image, SliceRequest("mig", "1g.10gb", host="gpu-node-2"), "gone")
    ended = running_session(owner, image, SliceRequest("mig", "1g.10gb", host="gpu-node-2"), "ended")
    NotebookSession.objects.filter(pk=ended.pk).update(state=NotebookSession.State.STOPPED)
    for session in (alive, gone):  # their holdings began when their containers started
        assert session.slice_id is not None and session.container_started_at is not None
        holdings.started(session.slice_id, session.container_started_at)
    return alive, gone, ended


def proof_of(session: NotebookSession) -> Any:
    return Slice.objects.get(pk=session.slice_id).seen_at if session.slice_id else None


async def test_sessions_on_a_kube_host_are_followed_through_their_pods(
    cluster: Cluster,
    fleet: None,
    alice: User,
    settings,  # type: ignore[no-untyped-def]
) -> None:
    settings.DOCKER_ENGINES = {"gpu-node-2": f"kube://{NAMESPACE}"}
    settings.KUBERNETES_API = cluster.url
    alive, gone, ended = await in_thread(sessions, alice)
    others = "another-portal"
    await create(
        cluster,
        pod("jupyter-alive", alive.pk, django_settings.INSTANCE_ID),
        pod("jupyter-ended", ended.pk, django_settings.INSTANCE_ID),
        pod("jupyter-not-ours", ended.pk, others),
    )
    before = await in_thread(proof_of, alive)
    counts = await in_thread(reconcile)
    assert counts["confirmed"] == 1 and counts["ended"] == 1 and counts["containers_removed"] == 1, counts
    assert await pods_named(cluster) == {"jupyter-alive", "jupyter-not-ours"}
    alive_now = await in_thread(lambda: NotebookSession.objects.get(pk=alive.pk))
    gone_now = await in_thread(lambda: NotebookSession.objects.get(pk=gone.pk))
    assert alive_now.state == NotebookSession.State.RUNNING
    assert gone_now.state not in NotebookSession.ACTIVE
    after = await in_thread(proof_of, alive)
    assert after is not None and (before is None or after > before)  # its proof of life moved on

    settings.KUBERNETES_API = "http://127.0.0.1:1"  # the API away: nothing confirmed, nothing changed
    counts = await in_thread(reconcile)
    assert counts["confirmed"] == 0 and counts.get("ended", 0) == 0, counts
    still = await in_thread(lambda: NotebookSession.objects.get(pk=alive.pk))
    assert still.state == NotebookSession.State.RUNNING
