"""A render job's results: its finished frames, found by job and number (never by a path from a request),
a page of them at a time for its gallery, and all of them as one ZIP written as it is sent, the frames
stored as they are (PNG is compressed already), so the archive is never held in memory or on disk.
"""

from __future__ import annotations

import os
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import IO, BinaryIO, cast

from django.core.paginator import Page, Paginator
from django.db.models import QuerySet
from django.http import Http404
from django.utils import timezone

from sessions.render import files
from sessions.render.models import RenderFrame, RenderJob

BLOCK = 1 << 16
GALLERY_FRAMES = 48  # thumbnails on one page of a job's gallery (a job may have thousands)


def _done(job: RenderJob) -> QuerySet[RenderFrame]:
    if job.files_removed_at is not None:
        return RenderFrame.objects.none()
    return job.frame_results.filter(state=RenderFrame.State.DONE).exclude(output_path="").order_by("number")


def done_frames(job: RenderJob) -> list[RenderFrame]:
    """Its finished frames whose files are there: none once its files were removed."""
    return list(_done(job))


def gallery(job: RenderJob, number: str | None) -> Page[RenderFrame]:
    """One page of its finished frames, in order; a page that is not a number is the first, one past the
    end the last."""
    return Paginator(_done(job), GALLERY_FRAMES).get_page(number)


def frame_of(job: RenderJob, number: int) -> RenderFrame:
    frame = job.frame_results.filter(number=number, state=RenderFrame.State.DONE).first()
    if frame is None:
        raise Http404("No such finished frame in this job.")
    return frame


def open_inside(job: RenderJob, relative: str) -> BinaryIO:
    """The file a frame row names (its frame or its thumbnail), opened for reading: only a file of its own in
    the job's folder, reached without a link on the way and opened without following one; 404 otherwise. A
    run still going may swap its frames for links (its output folder is the sandbox's): what is served is
    the file that was checked."""
    path = PurePosixPath(relative)
    if not relative or path.is_absolute() or ".." in path.parts:
        raise Http404("That file is not there.")
    folder = job.folder_path().joinpath(*path.parts[:-1])
    opened = files.open_written(folder, path.name) if files.inside(job.folder_path(), folder) else None
    if opened is None:
        raise Http404("That file is not there.")
    return opened


def removed_words(job: RenderJob) -> str:
    """What the frame, thumbnail and ZIP addresses of a job whose files were removed answer (410)."""
    assert job.files_removed_at is not None
    kept = job.files_kept_days
    when = f"{timezone.localtime(job.files_removed_at):%Y-%m-%d}"
    after = f", kept {kept} day{'s' if kept != 1 else ''} after it ended" if kept else ""
    return (
        f"The files of render job {job.pk} were removed on {when}{after}: its frames, thumbnails and scene are "
        "gone. The job's record and its charges are kept."
    )


def download_name(job: RenderJob, frame: RenderFrame) -> str:
    return f"job{job.pk}-frame{frame.number:04d}{Path(frame.output_path).suffix.lower()}"


def archive_name(job: RenderJob) -> str:
    return f"render-job-{job.pk}-frames.zip"


class _Pipe:
    """A write-only, unseekable stream: zipfile writes into it, the generator hands the bytes on."""

    def __init__(self) -> None:
        self.written: list[bytes] = []

    def write(self, data: bytes) -> int:
        self.written.append(bytes(data))
        return len(data)

    def flush(self) -> None:
        pass

    def take(self) -> bytes:
        out = b"".join(self.written)
        self.written.clear()
        return out


def _entry(name: str, source: BinaryIO) -> zipfile.ZipInfo:
    """The archive's entry for an open file: its time, size and mode as the file has them, stored as it is."""
    found = os.fstat(source.fileno())
    entry = zipfile.ZipInfo(name, time.localtime(found.st_mtime)[:6])
    entry.file_size, entry.external_attr = found.st_size, (found.st_mode & 0xFFFF) << 16
    entry.compress_type = zipfile.ZIP_STORED
    return entry


def zip_stream(job: RenderJob, frames: list[RenderFrame]) -> Iterator[bytes]:
    """The frames as one ZIP, a block at a time; a frame whose file has gone is left out."""
    pipe = _Pipe()
    with zipfile.ZipFile(cast(IO[bytes], pipe), "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
        for frame in frames:
            try:
                source = open_inside(job, frame.output_path)
            except Http404:
                continue
            with source, archive.open(_entry(download_name(job, frame), source), mode="w") as target:
                while block := source.read(BLOCK):
                    target.write(block)
                    yield pipe.take()
            yield pipe.take()
    yield pipe.take()
