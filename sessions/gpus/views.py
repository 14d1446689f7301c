"""The operators' fleet pages: every host and GPU, one GPU's MIG picture, and the forms that change a GPU.

Changes go through ``sessions.gpus.fleet``; a refusal comes back as a form error
and nothing changes. With htmx the GPU page's region is swapped in place.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django import forms
from django.contrib import messages
from django.contrib.auth.models import User
from django.http import HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_POST

from portal.access import staff_required
from portal.http import PortalRequest
from sessions.gpus import fleet, hosts, orders
from sessions.gpus.backends import BackendError
from sessions.gpus.capacity import gpu_capacity
from sessions.gpus.catalog import GpuModel, UnknownModel
from sessions.gpus.forms import LayoutForm, PolicyForm, SharingForm, describe_layout
from sessions.gpus.models import Gpu, GpuHost, GpuInstance, Slice

DETAIL = "sessions/fleet_gpu.html"
LAYOUT_DEADLINE_S = 15  # an operator waits this long on the page for the host's agent
Change = Callable[[dict[str, Any]], str]


@dataclass(frozen=True)
class Block:
    """One cell of the MIG picture: an instance over its memory slices, or one free memory slice."""

    start: int
    size: int
    instance: GpuInstance | None = None
    slice: Slice | None = None

    @property
    def end(self) -> int:
        return self.start + self.size - 1

    @property
    def column(self) -> int:
        return self.start + 1


@dataclass(frozen=True)
class FitRow:
    profile: str
    compute_slices: int
    memory_gib: float
    starts: str
    count: int


@staff_required
@require_GET
def fleet_overview(request: PortalRequest) -> HttpResponse:
    # fleet_summary's GROUP BY drops the model's ordering, so order here.
    summary = sorted(fleet.fleet_summary(), key=lambda gpu: (gpu.host.name, gpu.index))
    gpus = [(gpu, _compute_total(gpu)) for gpu in summary]
    hosts = [(host, [row for row in gpus if row[0].host_id == host.pk]) for host in GpuHost.objects.all()]
    template = "sessions/fleet.html#hosts" if request.htmx.target == "fleet-hosts" else "sessions/fleet.html"
    return render(request, template, {"hosts": hosts})


@staff_required
@require_POST
def fleet_host_drain(request: PortalRequest, host_id: int) -> HttpResponse:
    """Take a host out of placement (``drain``) or bring it back (``resume``), by the button's value."""
    host, by = get_object_or_404(GpuHost, pk=host_id), request.user
    assert isinstance(by, User)  # staff_required
    action = request.POST.get("action")
    try:
        if action == "drain":
            hosts.drain(host.pk, by)
            messages.success(request, f"{host.name} is draining: what runs there runs on, nothing new starts there.")
        elif action == "resume":
            hosts.resume(host.pk, by)
            messages.success(request, f"{host.name} takes new work again.")
        else:
            messages.error(request, "Say drain or resume.")
    except hosts.HostRefused as error:
        messages.error(request, str(error))
    return redirect("fleet")


@staff_required
@require_GET
def fleet_gpu(request: PortalRequest, gpu_id: int) -> HttpResponse:
    return _render_detail(request, _get_gpu(gpu_id))


@staff_required
@require_POST
def fleet_gpu_policy(request: PortalRequest, gpu_id: int) -> HttpResponse:
    def change(data: dict[str, Any]) -> str:
        gpu = fleet.set_policy(gpu_id, data["policy"])
        _carried_out(gpu_id, "Its layout's instances were not removed")
        return f"The MIG policy is now {gpu.get_mig_policy_display().lower()}."

    return _change(request, _get_gpu(gpu_id), "policy_form", PolicyForm(request.POST), change)


@staff_required
@require_POST
def fleet_gpu_layout(request: PortalRequest, gpu_id: int) -> HttpResponse:
    gpu = _get_gpu(gpu_id)
    model = _model_or_none(gpu)
    if model is None:
        return _render_detail(request, gpu, problem="This GPU's model is not in the catalog, so it has no layouts.")

    def change(data: dict[str, Any]) -> str:
        fleet.set_layout(gpu_id, data["layout"])
        _carried_out(gpu_id, "The layout was not applied")
        return f"Layout applied: {describe_layout(data['layout']) or 'no instances'}."

    return _change(request, gpu, "layout_form", LayoutForm(request.POST, gpu_model=model), change)


@staff_required
@require_POST
def fleet_gpu_sharing(request: PortalRequest, gpu_id: int) -> HttpResponse:
    def change(data: dict[str, Any]) -> str:
        gpu = fleet.set_sharing(gpu_id, data["sharing"], data["share_limit"])
        if gpu.sharing == Gpu.Sharing.SHARED:
            return f"Now time-sliced: up to {gpu.share_limit} sessions at once."
        return "Now handed out as a whole GPU."

    return _change(request, _get_gpu(gpu_id), "sharing_form", SharingForm(request.POST), change)


def _carried_out(gpu_id: int, failure: str) -> None:
    """Wait for the host's agent to carry out an operator's change; refused with its reason if it did not."""
    try:
        orders.wait_for_gpu(gpu_id, LAYOUT_DEADLINE_S)
    except orders.OrderFailed as failed:
        raise fleet.FleetChangeRefused(f"{failure}: {failed.reason}") from None


def _change(request: PortalRequest, gpu: Gpu, name: str, form: forms.Form, change: Change) -> HttpResponse:
    """Validate ``form``, make the change, and answer: the page again on success, the form's errors if refused."""
    if form.is_valid():
        try:
            notice = change(form.cleaned_data)
        except (fleet.FleetChangeRefused, BackendError) as error:
            form.add_error(None, str(error))
        else:
            if request.htmx:
                return _render_detail(request, _get_gpu(gpu.pk), notice=notice)
            messages.success(request, notice)
            return redirect("fleet-gpu", gpu_id=gpu.pk)
    problem = " ".join(str(message) for errors in form.errors.values() for message in errors)
    return _render_detail(request, gpu, problem=problem, **{name: form})


def _render_detail(request: PortalRequest, gpu: Gpu, **context: Any) -> HttpResponse:
    model = _model_or_none(gpu)
    active = list(gpu.slices.filter(released_at__isnull=True).select_related("owner").order_by("allocated_at"))
    context = {
        "gpu": gpu,
        "model": model,
        "active_slices": active,
        "blocks": _blocks(gpu, model, active) if model and gpu.sharing == Gpu.Sharing.MIG else [],
        "fits": _fits(gpu, model) if model and gpu.sharing == Gpu.Sharing.MIG else [],
        "memory_slice_numbers": range(model.memory_slices if model else 0),
        "policy_form": PolicyForm(initial={"policy": gpu.mig_policy}),
        "layout_form": LayoutForm(gpu_model=model) if model else None,
        "sharing_form": SharingForm(initial={"sharing": gpu.sharing, "share_limit": gpu.share_limit}),
        **context,
    }
    template = f"{DETAIL}#detail" if request.htmx else DETAIL
    return render(request, template, context)


def _get_gpu(gpu_id: int) -> Gpu:
    return get_object_or_404(Gpu.objects.select_related("host"), pk=gpu_id)


def _model_or_none(gpu: Gpu) -> GpuModel | None:
    try:
        return gpu.catalog_model
    except UnknownModel:
        return None


def _compute_total(gpu: Gpu) -> int | None:
    model = _model_or_none(gpu)
    return model.compute_slices if model else None


def _blocks(gpu: Gpu, model: GpuModel, active: list[Slice]) -> list[Block]:
    """The instances in memory-slice order, with a free cell for every memory slice none covers."""
    holding = {taken.instance_id: taken for taken in active if taken.instance_id}
    blocks = [Block(i.start, i.size, i, holding.get(i.pk)) for i in gpu.instances.all()]
    covered = {start for block in blocks for start in range(block.start, block.start + block.size)}
    blocks += [Block(start, 1) for start in range(model.memory_slices) if start not in covered]
    return sorted(blocks, key=lambda block: block.start)


def _fits(gpu: Gpu, model: GpuModel) -> list[FitRow]:
    counts = gpu_capacity(gpu)
    return [
        FitRow(p.name, p.compute_slices, p.memory_gib, ", ".join(map(str, p.placements)), counts.get(p.name, 0))
        for p in model.profiles
    ]
