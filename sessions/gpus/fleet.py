"""Keeping the recorded fleet in step with what the backends find, and operator changes to it.

Only these functions, the allocator and the orders its host's agent carries out (``sessions.gpus.orders``)
write GPUs and their instances. Discovery changes a device (it reclaims an instance nobody recorded), so it
runs on the host's agent (``manage.py gpu_agent``, or ``manage.py sync_gpus`` by hand on the host); an
operator's layout is an order for that agent.
"""

from __future__ import annotations

import logging

from django.conf import settings
from django.db import transaction
from django.db.models import Count, Q
from django.utils import timezone

from sessions.gpus import orders, placement
from sessions.gpus.allocator import hold_every_pool
from sessions.gpus.backends import get_backend
from sessions.gpus.backends.base import FoundGpu, FoundHost, GpuBackend
from sessions.gpus.catalog import UnknownModel
from sessions.gpus.hosts import TWO_MACHINES
from sessions.gpus.models import Gpu, GpuHost, GpuInstance, HostOrder
from sessions.gpus.orders import recount

log = logging.getLogger(__name__)


class FleetChangeRefused(ValueError):
    """An operator change that would break a rule; the message says which."""


def sync_fleet(backend: GpuBackend | None = None) -> list[GpuHost]:
    """Record every host, GPU and MIG instance the backend finds; mark GPUs it no longer finds.

    Allocations wait meanwhile: the driver is asked only once every allocation in flight has
    recorded what it made (or rolled back), so its answer and the rows are compared at one moment.
    """
    backend = backend or get_backend()
    hosts = []
    with transaction.atomic():
        hold_every_pool()
        list(Gpu.objects.select_for_update().order_by("pk").values_list("pk", flat=True))  # releases in flight
        for found in backend.discover():
            with transaction.atomic():
                hosts.append(_sync_host(found, backend))
    return hosts


def _sync_host(found: FoundHost, backend: GpuBackend) -> GpuHost:
    host, _ = GpuHost.objects.update_or_create(
        name=found.name,
        defaults={
            "backend": found.backend,
            "driver_version": found.driver_version,
            "last_seen": timezone.now(),
            "mig_layout": settings.MIG_LAYOUT,  # the agent's own: whose layout its GPUs have
        },
    )
    seen, refused = [], []
    for found_gpu in found.gpus:
        elsewhere = Gpu.objects.filter(uuid=found_gpu.uuid).exclude(host=host).select_related("host").first()
        if elsewhere is not None:
            # Two hosts claim one GPU: a copied configuration, a cloned machine. Nothing moves: the GPU stays
            # with the host that reported it first, its slices with it, and this host is flagged.
            refused.append(f"GPU {found_gpu.index} reports UUID {found_gpu.uuid}, which {elsewhere.host} has")
            log.error("host %s: %s; not recorded", host, refused[-1])
            continue
        gpu = _sync_gpu(host, found_gpu, backend)
        seen.append(gpu.pk)
    host.gpus.exclude(pk__in=seen).update(state=Gpu.State.MISSING, state_detail="Not found at the last discovery.")
    problem = f"{'; '.join(refused)}: not recorded here (nothing moved)." if refused else ""
    if problem != host.problem and not host.problem.startswith(TWO_MACHINES):  # hosts.heartbeat's flag stays
        GpuHost.objects.filter(pk=host.pk).update(problem=problem)
        host.problem = problem
    return host


def _sync_gpu(host: GpuHost, found: FoundGpu, backend: GpuBackend) -> Gpu:
    gpu, _ = Gpu.objects.select_for_update().get_or_create(
        uuid=found.uuid,
        defaults={
            "host": host,
            "index": found.index,
            "model_name": found.model_name,
            "memory_mib": found.memory_mib,
            "sharing": found.sharing or (Gpu.Sharing.MIG if found.mig_enabled else Gpu.Sharing.WHOLE),
            "share_limit": found.share_limit,
        },
    )
    gpu.host, gpu.index, gpu.product_name = host, found.index, found.product_name
    gpu.model_name, gpu.memory_mib = found.model_name, found.memory_mib
    gpu.mig_capable, gpu.mig_enabled, gpu.mig_pending = found.mig_capable, found.mig_enabled, found.mig_pending
    gpu.state, gpu.state_detail = _state_of(gpu, found)
    if host.mig_layout == GpuHost.MigLayout.CLUSTER and gpu.mig_policy == Gpu.Policy.DYNAMIC:
        # mig-manager owns the layout: the instances found are taken as they are, none reclaimed or made.
        log.info("%s: its MIG layout is the cluster's; the instances found are its static layout", gpu)
        gpu.mig_policy = Gpu.Policy.STATIC
    if not orders.unfinished(gpu):  # else its agent is changing it: the next discovery compares
        _sync_instances(gpu, found, backend)
    gpu.save()
    return gpu


def _state_of(gpu: Gpu, found: FoundGpu) -> tuple[str, str]:
    if found.problem:
        return Gpu.State.ERROR, found.problem
    if gpu.sharing == Gpu.Sharing.MIG and not found.mig_enabled:
        return Gpu.State.ERROR, "Set to MIG slices, but MIG mode is off on the device; the portal never switches it."
    try:
        gpu.catalog_model  # noqa: B018 - raises for a model the catalog lacks
    except UnknownModel as error:
        return Gpu.State.ERROR, str(error)
    return Gpu.State.OK, ""


def _sync_instances(gpu: Gpu, found: FoundGpu, backend: GpuBackend) -> None:
    """Follow the driver's instances, on a GPU with no order outstanding. One the portal never recorded on a
    dynamic GPU is nobody's (every instance the portal makes is recorded with its order's result, and one
    made for a slice released meanwhile has its destroy order): it is reclaimed, not adopted, or it would block
    that room for good. On a static GPU
    an unrecorded instance is an operator's, made outside the portal, and becomes part of the layout."""
    on_device = {instance.device_uuid: instance for instance in found.instances}
    for recorded in gpu.instances.all():
        if recorded.device_uuid not in on_device:
            log.warning("MIG instance %s vanished from %s", recorded.device_uuid, gpu)
            recorded.delete()
    known = set(gpu.instances.values_list("device_uuid", flat=True))
    for device_uuid, instance in on_device.items():
        if device_uuid in known:
            continue
        if gpu.sharing == Gpu.Sharing.MIG and gpu.mig_policy == Gpu.Policy.DYNAMIC:
            log.warning("reclaiming MIG instance %s on %s: no slice of the portal's holds it", device_uuid, gpu)
            backend.destroy_instance(gpu.uuid, instance.gi_id)
        else:
            GpuInstance.record(gpu, instance, GpuInstance.Origin.LAYOUT)
    recount(gpu)


CLUSTER_OWNS_LAYOUT = (
    "This GPU's MIG layout is its Kubernetes node's (mig-manager applies it from the node's label; the host's agent "
    "runs with PORTAL_MIG_LAYOUT=cluster): change it there, and the portal takes the instances it finds."
)


def _lock_idle(gpu_id: int) -> Gpu:
    gpu = Gpu.objects.select_for_update().get(pk=gpu_id)
    busy = gpu.slices.filter(released_at__isnull=True).count()
    if busy:
        raise FleetChangeRefused(f"{busy} slice(s) on this GPU are in use; change it once they have ended.")
    return gpu


@transaction.atomic
def set_policy(gpu_id: int, policy: str) -> Gpu:
    """Switch an idle MIG GPU's policy; to dynamic, its layout's instances go (an order for its host's agent,
    which the caller may wait for: ``orders.wait_for_gpu``)."""
    gpu = _lock_idle(gpu_id)
    if gpu.sharing != Gpu.Sharing.MIG:
        raise FleetChangeRefused("Only a GPU that hands out MIG slices has a MIG policy.")
    if gpu.host.mig_layout == GpuHost.MigLayout.CLUSTER and policy != gpu.mig_policy:
        raise FleetChangeRefused(CLUSTER_OWNS_LAYOUT)
    if policy not in Gpu.Policy.values:
        raise FleetChangeRefused(f"Unknown policy {policy!r}.")
    if policy == Gpu.Policy.DYNAMIC and gpu.mig_policy != policy:
        _new_layout(gpu, [])
    gpu.mig_policy = policy
    gpu.save(update_fields=["mig_policy"])
    return gpu


@transaction.atomic
def set_layout(gpu_id: int, layout: list[tuple[str, int]]) -> HostOrder:
    """Order a static GPU's MIG instances replaced with ``layout`` (its host's agent applies it; the caller may
    wait: ``orders.wait``); refuses illegal layouts, saying why."""
    gpu = _lock_idle(gpu_id)
    if gpu.host.mig_layout == GpuHost.MigLayout.CLUSTER:
        raise FleetChangeRefused(CLUSTER_OWNS_LAYOUT)
    if gpu.sharing != Gpu.Sharing.MIG or gpu.mig_policy != Gpu.Policy.STATIC:
        raise FleetChangeRefused("Layouts apply to MIG GPUs with the static policy; switch the policy first.")
    try:
        placement.layout_of(gpu.catalog_model, layout)
    except ValueError as error:  # UnknownProfile is a ValueError too
        raise FleetChangeRefused(str(error)) from None
    return _new_layout(gpu, layout)


def _new_layout(gpu: Gpu, layout: list[tuple[str, int]]) -> HostOrder:
    """The GPU's old instances are off the books at once (nothing is handed out of a layout being replaced);
    its agent destroys them on the device and records the new ones."""
    gpu.instances.all().delete()
    recount(gpu)
    gpu.save()
    return orders.apply_layout(gpu, layout)


@transaction.atomic
def set_sharing(gpu_id: int, sharing: str, share_limit: int | None = None) -> Gpu:
    gpu = _lock_idle(gpu_id)
    if sharing not in Gpu.Sharing.values:
        raise FleetChangeRefused(f"Unknown sharing mode {sharing!r}.")
    if sharing == Gpu.Sharing.MIG and not gpu.mig_enabled:
        raise FleetChangeRefused("MIG mode is off on this GPU; an administrator must enable it on the host.")
    if sharing != Gpu.Sharing.MIG and gpu.mig_enabled:
        raise FleetChangeRefused("MIG mode is on for this GPU, so it can only hand out MIG slices.")
    if share_limit is not None and not 2 <= share_limit <= 64:
        raise FleetChangeRefused("A time-sliced GPU takes 2 to 64 sessions.")
    gpu.sharing = sharing
    if share_limit is not None:
        gpu.share_limit = share_limit
    gpu.save()
    return gpu


def fleet_summary() -> list[Gpu]:
    """Every GPU with its host and active-slice count, for the operator pages."""
    return list(
        Gpu.objects.select_related("host")
        .annotate(in_use=Count("slices", filter=Q(slices__released_at__isnull=True)))
        .order_by("host__name", "index")
    )
