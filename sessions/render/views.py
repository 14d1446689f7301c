"""The Render jobs page (upload form, the jobs list), one job's page (its unpacking, its estimate to confirm, its
live progress, cancel and re-queue) and its results (thumbnails, frames, all frames as one streamed ZIP).

The scene itself goes up in parts before the form is sent (sessions/render/tus.py); the form names the upload.
"""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import User
from django.http import FileResponse, Http404, HttpResponse, HttpResponseGone, StreamingHttpResponse
from django.http.response import HttpResponseBase
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.cache import cache_control
from django.views.decorators.http import require_GET, require_POST
from django_htmx.http import HttpResponseClientRedirect, HttpResponseClientRefresh

from portal.http import PortalRequest
from portal.roles import can_launch, is_operator, launch_refusal
from sessions import access
from sessions.gpus import pricing, workloads
from sessions.gpus.holders import Holder
from sessions.gpus.offers import offers
from sessions.render import access as render_access
from sessions.render import jobs, progress, results, retention, services, unpacking, uploads
from sessions.render.forms import JobFilterForm, MainFileForm, RenderJobForm
from sessions.render.limits import Refused
from sessions.render.models import RenderChunk, RenderJob
from sessions.render.scenefile import SceneRefused
from sessions.storage import shown, usage

PAGE = "sessions/render_job_list.html"
DETAIL = "sessions/render_job_detail.html"
LISTED = 50
ESTIMATING = (RenderJob.State.VALIDATED, RenderJob.State.ESTIMATING)  # the page polls for the estimate
GALLERY = "render-gallery"  # the job page's region of finished frames, a page at a time


def _person(request: PortalRequest) -> User:
    assert isinstance(request.user, User)
    return request.user


def _page(request: PortalRequest, form: RenderJobForm | None = None, status: int = 200) -> HttpResponse:
    user = _person(request)
    listed = _listed(request)
    # One look at all their slices and one count of all their frames, not one of each per job.
    costs = progress.costs_so_far(job.pk for job in listed)
    done = progress.frames_done(job.pk for job in listed)
    context: dict[str, object] = {
        "jobs": listed,
        "rows": [
            (
                job,
                progress.shown(costs[job.pk]),
                done[job.pk],
                progress.percent_of(done[job.pk], job.frame_count),
                job.badge_for(user.pk),
            )
            for job in listed
        ],
        "everyone": is_operator(user),
        "cancellable": [state for state in RenderJob.State if state not in RenderJob.ENDED],
    }
    if is_operator(user):
        context["filters"] = JobFilterForm(request.GET or None)
    context.update(_storage(user))
    if not can_launch(user):
        context["refusal"] = launch_refusal()
    else:
        context["form"] = form or RenderJobForm(offers=offers(user))
        context["part_bytes"] = settings.RENDER_UPLOAD_PART_BYTES
        context["wallet"] = pricing.current().wallet(user)
    target = request.htmx.target if request.htmx else None
    if target in ("render-upload", "render-jobs"):
        return render(request, f"{PAGE}#{target}", context, status=status)
    return render(request, PAGE, context, status=status)


def _storage(user: User) -> dict[str, shown.Section]:
    """The person's own storage: used of quota, what uses it, and how each render job or upload is removed."""
    found = usage.usage_of(user)
    return {"storage": shown.section(found, _removals(user, found))}


def _removals(user: User, found: usage.Usage) -> dict[tuple[str, str], shown.Removal]:
    """A job that has not ended is cancelled (before it is queued, that removes its files); an ended one's files
    are removed; an upload on its way is discarded."""
    kinds = usage.Kind
    removals: dict[tuple[str, str], shown.Removal] = {}
    job_ids = [int(item.key) for item in found.items if item.kind == kinds.RENDER_JOB and item.key.isdigit()]
    for job in RenderJob.objects.filter(owner=user, pk__in=job_ids, files_removed_at__isnull=True):
        if job.ended:
            removal = shown.Removal(
                reverse("render-job-remove-files", args=[job.pk]),
                "Remove files",
                f"Remove the files of {job.upload_name}: its scene and frames",
            )
        else:
            address = reverse("render-job-cancel", args=[job.pk])
            removal = shown.Removal(address, "Cancel", f"Free the storage of {job.upload_name}: cancel the job")
        removals[(kinds.RENDER_JOB, str(job.pk))] = removal
    for item in found.items:
        if item.kind == kinds.UPLOAD:
            address = reverse("render-upload-discard", args=[item.key])
            removals[(item.kind, item.key)] = shown.Removal(address, "Discard", f"Discard the upload of {item.label}")
    return removals


def _listed(request: PortalRequest) -> list[RenderJob]:
    """The person's own jobs; staff see everyone's, narrowed by the filter form."""
    found = render_access.render_jobs_for(request.user).select_related("owner")
    if is_operator(request.user):
        filters = JobFilterForm(request.GET or None)
        if filters.is_valid():
            if filters.cleaned_data["owner"]:
                found = found.filter(owner__username=filters.cleaned_data["owner"])
            if filters.cleaned_data["state"]:
                found = found.filter(state=filters.cleaned_data["state"])
    return list(found.order_by("-created_at")[:LISTED])


@login_required
@require_GET
def job_list(request: PortalRequest) -> HttpResponse:
    return _page(request)


@login_required
@require_POST
def upload(request: PortalRequest) -> HttpResponse:
    """The form's settings and the upload they go with (already on disk, in parts): a job that waits to be
    unpacked, or the form again saying why not."""
    if not can_launch(request.user):
        return _page(request, status=403)
    user = _person(request)
    form = RenderJobForm(request.POST, offers=offers(user))
    if form.is_valid():
        data = form.cleaned_data
        try:
            job = jobs.create_job(user, data["upload"], data["sha256"], form.choices())
        except SceneRefused as refused:
            if refused.code in ("incomplete", "quota"):  # the upload is kept: the form names it again
                form.add_error("upload", refused.message)
            else:
                form.scene_refused(refused.message)
        else:
            messages.success(request, _next_step(job))
            url = reverse("render-job-detail", args=[job.pk])
            return HttpResponseClientRedirect(url) if request.htmx else redirect(url)
    return _page(request, form, status=200 if request.htmx else 400)


def _next_step(job: RenderJob) -> str:
    return (
        f"{job.upload_name} is uploaded. It is unpacked and checked next, then a probe renders a few of its frames as "
        "the job will, to estimate the time and cost; you confirm before the job is queued."
    )


@login_required
@require_GET
def job_detail(request: PortalRequest, job_id: int) -> HttpResponse:
    job = render_access.render_job_for(request.user, job_id)
    return _detail(request, job)


def _detail(
    request: PortalRequest, job: RenderJob, form: MainFileForm | None = None, status: int = 200
) -> HttpResponse:
    gallery = results.gallery(job, request.GET.get("page"))
    if request.htmx and request.htmx.target == GALLERY:  # a link of the gallery's pager: the gallery alone
        return render(request, f"{DETAIL}#{GALLERY}", {"job": job, "gallery": gallery})
    mine = job.owner_id == request.user.pk
    context: dict[str, object] = {
        "job": job,
        "badge": job.badge_for(request.user.pk),
        "mine": mine,
        "estimate": services.estimate_of(job) if job.state == RenderJob.State.AWAITING_CONFIRMATION else None,
        "progress": progress.snapshot(job),
        "gallery": gallery,
        "failed_chunks": list(job.chunks.filter(state=RenderChunk.State.FAILED).exclude(log_excerpt="")[:3]),
        "cancellable": not job.ended,
        "may_requeue": access.may(request.user, access.Action.REQUEUE, job) and job.files_removed_at is None,
        "files_until": _files_until(job),
    }
    if job.state == RenderJob.State.UPLOADED and mine:
        context["main_form"] = form or MainFileForm(job=job)
    if job.state == RenderJob.State.UNPACKING:
        context["unpacking"] = unpacking.shown(job)
    if request.htmx and request.htmx.target == "render-unpacking":
        if job.state != RenderJob.State.UNPACKING:  # unpacked, refused or cancelled: the whole page changes
            return HttpResponseClientRefresh()
        return render(request, f"{DETAIL}#render-unpacking", context, status=status)
    if request.htmx and request.htmx.target == "render-estimate":
        if job.state not in ESTIMATING:  # the estimate, or the probe's failure, is in: the whole page changes
            return HttpResponseClientRefresh()
        return render(request, f"{DETAIL}#render-estimate", context, status=status)
    return render(request, DETAIL, context, status=status)


def _files_until(job: RenderJob) -> object:
    """When an ended job's files go (retention); None while it runs or once they went."""
    if not job.ended or job.finished_at is None or job.files_removed_at is not None:
        return None
    return job.finished_at + timedelta(days=settings.RENDER_RETENTION_DAYS)


@login_required
@require_POST
def choose_main_file(request: PortalRequest, job_id: int) -> HttpResponse:
    job = render_access.render_job_for(request.user, job_id, access.Action.CONFIGURE)
    form = MainFileForm(request.POST, job=job)
    if form.is_valid():
        try:
            job = jobs.choose_main_file(job.pk, form.cleaned_data["main_file"])
        except (SceneRefused, RenderJob.BadStep) as refused:
            form.add_error("main_file", str(refused))
        else:
            messages.success(request, f"{job.main_file} is checked next, then the estimate comes.")
            return redirect("render-job-detail", job.pk)
    return _detail(request, job, form, status=400)


@login_required
@require_POST
def confirm(request: PortalRequest, job_id: int) -> HttpResponse:
    """Its owner accepts the estimate and the job is queued; the money is theirs, so only they confirm."""
    job = render_access.render_job_for(request.user, job_id, access.Action.CONFIGURE)
    try:
        services.confirm(job.pk, _person(request))
    except services.Refused as refused:
        messages.error(request, str(refused))
        return _detail(request, job, status=409)
    messages.success(request, f"{job.upload_name} is queued; its frames render as slices come free.")
    return redirect("render-job-detail", job.pk)


@login_required
@require_POST
def cancel(request: PortalRequest, job_id: int) -> HttpResponse:
    """Its owner, or an operator, cancels a job in any state before it ends; anyone else gets a 404."""
    job = render_access.render_job_for(request.user, job_id, access.Action.STOP)
    before_queue = job.state in (*RenderJob.BEFORE_QUEUE, RenderJob.State.ESTIMATING)  # its files go
    assert isinstance(request.user, User)
    try:
        workloads.stop(Holder.render(job.pk), workloads.Reason.USER, by=request.user)  # an operator's: STAFF
    except RenderJob.BadStep as refused:
        messages.error(request, str(refused))
        job.refresh_from_db()
        return _detail(request, job, status=409)
    if before_queue:
        messages.info(request, f"Cancelled {job.upload_name}; its files are removed.")
        return redirect("render-job-list")
    messages.info(request, f"Cancelled {job.upload_name}; its containers stop and its charges end now.")
    return redirect("render-job-detail", job.pk)


@login_required
@require_POST
def requeue_failed(request: PortalRequest, job_id: int) -> HttpResponse:
    """A failed job's frames that are not done render again; its owner or an operator asks."""
    job = render_access.render_job_for(request.user, job_id, access.Action.REQUEUE)
    try:
        services.requeue_failed(job.pk)
    except services.Refused as refused:
        messages.error(request, str(refused))
        return _detail(request, job, status=409)
    messages.success(request, "The frames that are not done are queued again.")
    return redirect("render-job-detail", job.pk)


@login_required
@require_POST
def remove_files(request: PortalRequest, job_id: int) -> HttpResponse:
    """An ended job's files go now rather than at the end of its retention (its owner or an operator asks), to
    make room in the owner's storage quota; its record and charges stay. A job that has not ended is cancelled
    first."""
    job = render_access.render_job_for(request.user, job_id, access.Action.REMOVE_FILES)
    try:
        removed = retention.remove_now(job.pk)
    except RenderJob.BadStep as refused:
        messages.error(request, str(refused))
        return _detail(request, job, status=409)
    if removed:
        messages.info(request, f"The files of {job.upload_name} are removed; its record and charges are kept.")
    return redirect("render-job-list")


@login_required
@require_POST
def discard_upload(request: PortalRequest, token: str) -> HttpResponse:
    """Its owner discards an upload on its way (as the tus client's DELETE does), and what it reserved is freed."""
    try:
        upload = uploads.find(_person(request), token)
    except Refused as refused:
        raise Http404(refused.message) from None
    uploads.discard(upload)
    messages.info(request, f"The upload of {upload.name} is discarded.")
    return redirect("render-job-list")


# Results: each looks the frame up by job and number; the file is the one its row names. Once the job's
# files were removed (retention), each answers 410 and says when: the job's page shows its record still.


def _gone(job: RenderJob) -> HttpResponse | None:
    if job.files_removed_at is None:
        return None
    return HttpResponseGone(results.removed_words(job), content_type="text/plain; charset=utf-8")


@login_required
@require_GET
@cache_control(private=True)  # someone's own frames: no shared cache keeps them
def frame_thumbnail(request: PortalRequest, job_id: int, number: int) -> HttpResponseBase:
    job = render_access.render_job_for(request.user, job_id)
    if gone := _gone(job):
        return gone
    return FileResponse(
        results.open_inside(job, results.frame_of(job, number).thumbnail_path), content_type="image/jpeg"
    )


@login_required
@require_GET
@cache_control(private=True)  # someone's own frames: no shared cache keeps them
def frame_download(request: PortalRequest, job_id: int, number: int) -> HttpResponseBase:
    job = render_access.render_job_for(request.user, job_id)
    if gone := _gone(job):
        return gone
    frame = results.frame_of(job, number)
    opened = results.open_inside(job, frame.output_path)
    return FileResponse(opened, as_attachment=True, filename=results.download_name(job, frame))


@login_required
@require_GET
@cache_control(private=True)  # someone's own frames: no shared cache keeps them
def frames_zip(request: PortalRequest, job_id: int) -> HttpResponseBase:
    job = render_access.render_job_for(request.user, job_id)
    if gone := _gone(job):
        return gone
    response = StreamingHttpResponse(results.zip_stream(job, results.done_frames(job)), content_type="application/zip")
    response["Content-Disposition"] = f'attachment; filename="{results.archive_name(job)}"'
    return response
