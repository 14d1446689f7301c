"""The portal's side of the render file store, for GPU hosts' render workers (``sessions.render.portalstore``
says the protocol): a job's scene out, its frames and thumbnails in, each call signed for that one job.

Only a worker holding PORTAL_FILE_STORE_KEY gets anything; a token for another job, an old one or none is
refused alike. What comes in goes only into the job's own ``frames`` and ``thumbnails`` folders, under plain
names, each part bounded by PORTAL_RENDER_UPLOAD_PART_BYTES and each file by PORTAL_RENDER_MAX_OUTPUT_BYTES, and
is moved into place only once the checksum the worker read matches what arrived. A job whose files were removed
(cancelled, expired) answers 410 Gone, and nothing is made again for it.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from functools import wraps
from pathlib import Path, PurePosixPath

from django.conf import settings
from django.http import FileResponse, HttpRequest, HttpResponse, JsonResponse
from django.http.response import HttpResponseBase
from django.views.decorators.cache import never_cache
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from sessions.render import files, filestore, storage
from sessions.render.models import RenderJob
from sessions.render.portalstore import signed_host
from sessions.render.protocol import OUTPUT_PATH, scene_relative

log = logging.getLogger(__name__)
View = Callable[..., HttpResponseBase]


def _refuse(status: int, error: str) -> JsonResponse:
    return JsonResponse({"error": error}, status=status)


def for_a_worker(view: View) -> View:
    """The view answers only a call signed for its job, and only while the job's files are there."""

    @csrf_exempt
    @never_cache
    @wraps(view)
    def checked(request: HttpRequest, job_id: int, **named: str) -> HttpResponseBase:
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        host = signed_host(token.strip(), job_id) if scheme == "Bearer" else None
        if host is None:
            return _refuse(403, "This is the render workers' file store; the call is not signed for this job.")
        job = RenderJob.objects.filter(pk=job_id).first()
        if job is None or job.files_removed_at is not None or not job.folder_path().is_dir():
            return _refuse(410, "This job's files are gone.")
        return view(request, job, **named)

    return checked


@require_GET
@for_a_worker
def scene(request: HttpRequest, job: RenderJob) -> HttpResponse:
    """The scene's files, in order, with its recorded checksum (the worker checks what it fetched against it),
    and the job's estimate."""
    try:
        listed = [{"path": path, "size": info.st_size} for path, info in filestore.plain_files(job.scene_path())]
    except (FileNotFoundError, filestore.SceneChanged) as error:
        return _refuse(409, f"The scene cannot be given: {error}")
    try:  # what the probe found, which the worker reads (the size of the frames it may decode)
        estimate = json.loads((job.folder_path() / filestore.ESTIMATE_FILE).read_text())
    except (OSError, ValueError):
        estimate = None
    return JsonResponse({"sha256": job.scene_sha256, "files": listed, "estimate": estimate})


@require_GET
@for_a_worker
def scene_file(request: HttpRequest, job: RenderJob, path: str) -> HttpResponseBase:
    try:
        relative = scene_relative(path)
    except ValueError as error:
        return _refuse(400, str(error))
    folder = job.scene_path()
    target = folder.joinpath(*relative.parts)
    if not files.inside(folder, target.parent):  # through no link of the scene's (unpacking makes none)
        return _refuse(404, "No such file in the scene.")
    try:
        descriptor = os.open(target, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return _refuse(404, "No such file in the scene.")
    return FileResponse(os.fdopen(descriptor, "rb"), content_type="application/octet-stream")


@require_http_methods(["PUT", "POST"])
@for_a_worker
def output(request: HttpRequest, job: RenderJob, path: str) -> HttpResponse:
    """PUT a part at ``?offset=``, or POST the whole file's size and checksum: it is moved into place."""
    if not OUTPUT_PATH.fullmatch(path):
        return _refuse(400, "Only a run's frames and the thumbnails are given back, each under a plain name.")
    target = job.folder_path().joinpath(*PurePosixPath(path).parts)
    if not files.inside(job.folder_path(), target.parent):  # a link on the way (a sandbox's): nothing goes there
        return _refuse(409, "The file's folder is not a plain folder of the job's.")
    aside = target.with_name(f".{target.name}.part")
    if request.method == "PUT":
        return _part(request, job, aside)
    return _whole(request, job, path, target, aside)


def _part(request: HttpRequest, job: RenderJob, aside: Path) -> HttpResponse:
    offset = request.GET.get("offset", "")
    if not offset.isdigit():
        return _refuse(400, "Say where the part goes (?offset=<bytes>).")
    body = request.read(settings.RENDER_UPLOAD_PART_BYTES + 1)
    if len(body) > settings.RENDER_UPLOAD_PART_BYTES:
        return _refuse(413, f"A part is at most {settings.RENDER_UPLOAD_PART_BYTES} bytes.")
    if int(offset) + len(body) > settings.RENDER_MAX_OUTPUT_BYTES:
        return _refuse(413, "The file would be larger than a run may write (PORTAL_RENDER_MAX_OUTPUT_BYTES).")
    files.make_private(aside.parent)
    descriptor = os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(descriptor, "wb") as out:
        size = os.fstat(out.fileno()).st_size
        if int(offset) > size:
            return JsonResponse({"error": f"Only {size} bytes are here; send from there.", "size": size}, status=409)
        out.truncate(int(offset))  # a part sent again replaces what it sent before
        out.seek(int(offset))
        out.write(body)
    return JsonResponse({"size": int(offset) + len(body)})


def _whole(request: HttpRequest, job: RenderJob, path: str, target: Path, aside: Path) -> HttpResponse:
    try:
        declared = json.loads(request.body)
        size, sha256 = int(declared["size"]), str(declared["sha256"])
    except (ValueError, KeyError, TypeError):
        return _refuse(400, 'Say the whole file\'s size and checksum: {"size": <bytes>, "sha256": "<hex>"}.')
    opened = files.open_written(aside.parent, aside.name)
    if opened is None:
        if target.is_file():  # declared whole before, and the answer was lost: the same again
            with target.open("rb") as kept:
                if filestore.file_checksum(kept) == sha256:
                    return JsonResponse({"path": path, "sha256": sha256})
        return _refuse(409, "No parts of this file are here.")
    with opened:
        found, arrived = filestore.file_checksum(opened), os.fstat(opened.fileno()).st_size
    if (arrived, found) != (size, sha256):
        aside.unlink(missing_ok=True)
        log.warning("render job %s: %s arrived as %s bytes, sha256 %s; declared %s, %s", job.pk, path, arrived,
                    found[:12], size, sha256[:12])  # fmt: skip
        return _refuse(422, f"What arrived ({arrived} bytes) is not the file declared ({size} bytes); send it again.")
    os.replace(aside, target)
    return JsonResponse({"path": path, "sha256": sha256})


@require_POST
@for_a_worker
def measure(request: HttpRequest, job: RenderJob) -> HttpResponse:
    storage.measure_job(job)
    return HttpResponse(status=204)
