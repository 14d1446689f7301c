"""Notebooks' share of each person's storage quota (``sessions.storage``): their work volume and what each of
their sessions' containers writes outside it (its writable layer).

Neither can be capped on the engine this portal is built for: Debian's docker.io 20.10 with overlay2 takes a
container's ``--storage-opt size=`` only on xfs mounted with ``pquota`` (on ext4 it refuses to create the
container), and the local volume driver has no size limit at all. So both are measured, every
PORTAL_STORAGE_MEASURE_MINUTES: a work volume while its owner has a session, and once more after one ended, in a
short container of the portal's (``sessions.runtime.disk``); a writable layer as the engine reports it (SizeRw).
Every engine that runs sessions is measured, each on its own; a work volume on another host's engine is that
host's copy, which counts beside the others.
While a person's files fill their quota a launch is refused, and each running session's card says so; a running
session is never stopped for it, as that would lose what its owner has not saved.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from django.contrib.auth.models import User
from django.db.models import Max
from django.urls import reverse

from portal import push
from sessions.gpus.models import GpuHost
from sessions.notebooks.models import NotebookSession, WorkVolume
from sessions.runtime import disk, engines
from sessions.runtime.docker import DockerRuntime, RuntimeError_
from sessions.runtime.engine_config import KUBE
from sessions.runtime.watchdogs import size_words
from sessions.storage import shown, usage
from sessions.storage.models import StorageUse

if TYPE_CHECKING:
    from sessions.runtime.kube.pods import PodRuntime

log = logging.getLogger(__name__)
Kind = StorageUse.Kind
WORK_FOLDER = "work/"


def measure_all() -> int:
    """The periodic measure of notebooks' files on every engine that runs sessions (``sessions.runtime.engines``),
    each on its own: one that does not answer keeps its figures as they were and stops nothing elsewhere. People
    with a session whose files fill their quota now, and did not before, hear so on their open pages (their cards
    then warn). Returns how many things it measured."""
    running = set(NotebookSession.objects.filter(state__in=NotebookSession.ACTIVE).values_list("owner_id", flat=True))
    before = _full(running)
    measured, layers, silent = 0, {}, []
    for endpoint, hosts in engines.by_engine(GpuHost.objects.values_list("name", flat=True)).items():
        try:
            if endpoint.startswith(KUBE):  # a namespace of a cluster: its work claims (no layer: a pod's is bounded)
                from sessions.runtime.kube.pods import PodRuntime  # the cluster's client, loaded where it is used

                measured += _measure_claims(PodRuntime(endpoint), _copy_on(endpoint, hosts))
                continue
            runtime = engines.at(endpoint)
            measured += _measure_volumes(runtime, _copy_on(endpoint, hosts))
            layers.update(runtime.session_layers())
        except (RuntimeError_, OSError) as error:
            log.warning(
                "notebook files on the engine of %s not measured: %s", ", ".join(hosts) or "this machine", error
            )
            silent += hosts
    measured += _record_layers(layers, silent)
    for owner_id in _full(running) - before:
        push.notify_user(owner_id, {"type": "session.warning", "reason": "storage"})
    return measured


def _copy_on(endpoint: str, hosts: list[str]) -> str:
    """How a work volume's copy on this engine is told from another engine's: nothing on the local engine, else
    the first host it runs (a person's work folder on another host is another volume of the same name)."""
    return "" if endpoint == engines.LOCAL or not hosts else hosts[0]


def _key(volume: WorkVolume, host: str) -> str:
    return f"{volume.name}@{host}" if host else volume.name


def _due_volumes(host: str) -> list[WorkVolume]:
    """Work volumes that may have changed since they were measured on this engine: their owner has a session, or
    had one end since, or they were never measured there."""
    measured = dict(StorageUse.objects.filter(kind=Kind.WORK_VOLUME).values_list("key", "measured_at"))
    active = set(NotebookSession.objects.filter(state__in=NotebookSession.ACTIVE).values_list("owner_id", flat=True))
    last_end = dict(NotebookSession.objects.values_list("owner_id").annotate(last=Max("ended_at")))
    due = []
    for volume in WorkVolume.objects.all():
        at, ended = measured.get(_key(volume, host)), last_end.get(volume.owner_id)
        if at is None or volume.owner_id in active or (ended is not None and ended >= at):
            due.append(volume)
    return due


def _measure_volumes(runtime: DockerRuntime, host: str) -> int:
    due = _due_volumes(host)
    if not due:
        return 0
    existing = runtime.volume_names()  # a volume never made (no session yet) is not mounted: that would make it
    for volume in due:
        if volume.name not in existing:
            usage.forget(Kind.WORK_VOLUME, _key(volume, host))
    present = [volume for volume in due if volume.name in existing]
    sizes = disk.volume_bytes(runtime, [volume.name for volume in present]) if present else {}
    for volume in present:
        if volume.name in sizes:
            _record_volume(volume, host, sizes[volume.name])
    return len(sizes)


def _measure_claims(runtime: PodRuntime, host: str) -> int:
    """On a Kubernetes namespace a work folder is the person's claim (``PortalKubeSpawner``), counted as what the
    cluster holds for it (its capacity): nothing reads what is written into a claim no pod mounts."""
    due = _due_volumes(host)
    if not due:
        return 0
    sizes = runtime.claim_sizes([volume.name for volume in due])
    for volume in due:
        if volume.name not in sizes:  # never made (no session there yet), or removed
            usage.forget(Kind.WORK_VOLUME, _key(volume, host))
            continue
        _record_volume(volume, host, sizes[volume.name])
    return len(sizes)


def _record_volume(volume: WorkVolume, host: str, size: int) -> None:
    label, where = (f"{WORK_FOLDER} on {host}" if host else WORK_FOLDER), reverse("session-list")
    usage.record(volume.owner_id, Kind.WORK_VOLUME, _key(volume, host), label=label, size=size, url=where)


def _record_layers(layers: dict[int, int], silent: list[str]) -> int:
    """The sessions' writable layers found on the engines that answered; a layer is forgotten once its container
    is gone, but not while its session's host's engine is silent (nobody saw it go)."""
    sessions = list(NotebookSession.objects.filter(pk__in=list(layers)).values_list("pk", "owner_id", "server_name"))
    for session_id, owner_id, name in sessions:
        usage.record(
            owner_id,
            Kind.CONTAINER_LAYER,
            str(session_id),
            label=name,
            size=layers[session_id],
            url=reverse("session-detail", args=[session_id]),
        )
    unseen = NotebookSession.objects.filter(slice__gpu__host__name__in=silent).values_list("pk", flat=True)
    usage.forget_all_but(Kind.CONTAINER_LAYER, [str(pk) for pk, _, _ in sessions] + [str(pk) for pk in unseen])
    return len(sessions)


def _full(owner_ids: set[int]) -> set[int]:
    return {owner.pk for owner in User.objects.filter(pk__in=owner_ids) if usage.usage_of(owner).full}


def launch_refusal(owner: User) -> str | None:
    """Why a new session is refused for storage, in words; None while the person's files leave room."""
    found = usage.usage_of(owner)
    if not found.full:
        return None
    return (
        f"A new session is refused while your files fill your storage quota. {shown.used_words(found)}. To make "
        f"room, {shown.REMOVE}. If your work folder alone fills it, ask an operator to raise your quota for a "
        "while, so that a session can start for you to tidy it."
    )


def card_warning(found: usage.Usage) -> str | None:
    """What each running session's card says while its owner's files fill their quota; None otherwise."""
    if not found.full:
        return None
    folder = found.of_kind(Kind.WORK_VOLUME) + found.of_kind(Kind.CONTAINER_LAYER)
    return (
        f"Your files take {size_words(found.used)} of your {size_words(found.limit)} storage quota "
        f"({size_words(folder)} of it in notebooks). This session keeps running (stopping it would lose "
        "unsaved work), but new sessions, uploads and renders are refused until you delete files you no longer "
        "need in work/ from JupyterLab, or remove render jobs' files on the Render jobs page."
    )
