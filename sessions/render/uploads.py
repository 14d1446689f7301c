"""A scene on its way up, in parts (the tus protocol, sessions/render/tus.py speaks it): each part is small, written
into the upload's file on disk as it comes, and an upload cut off resumes from what is on disk.

Folders are named so nobody can guess another person's: ``<keyed hash of the person>/<random name>`` below
PORTAL_RENDER_DIR, the folder its job keeps. Files are made and opened so that they never follow a link. The
SHA-256 of the whole file is kept as the parts are written (again from disk only when a part reaches a process
that did not see the one before), so the job's form compares it with the browser's without reading the file.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import secrets
import shutil
import threading
from collections import OrderedDict
from datetime import datetime, timedelta
from pathlib import Path, PurePosixPath
from typing import Any, Protocol

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from sessions.render import limits, storage
from sessions.render.files import make_private
from sessions.render.limits import Refused
from sessions.render.models import RenderUpload
from sessions.render.scenefile import size_words

KINDS = {".blend": "blend", ".zip": "zip"}
# Where each kind is written inside the job folder: a .blend is the scene itself, a zip is unpacked later.
STORED_AS = {"blend": PurePosixPath("scene/scene.blend"), "zip": PurePosixPath("upload.zip")}
_READ = 1024 * 1024


class Readable(Protocol):
    def read(self, size: int = ..., /) -> bytes: ...


def owner_folder(owner: User) -> str:
    """A person's folder name: keyed by the secret key and the account's creation moment, so nobody can
    name another's, and an account made after a database reset never lands in an old one's folder."""
    identity = f"render:{owner.pk}:{owner.date_joined.isoformat()}".encode()
    return "u" + hmac.new(settings.SECRET_KEY.encode(), identity, hashlib.sha256).hexdigest()[:32]


def remove_folder(folder: Path) -> None:
    """Remove a job's folder, and its owner's folder once nothing else is in it."""
    shutil.rmtree(folder, ignore_errors=True)
    with contextlib.suppress(OSError):  # another job of theirs lives there, or it was never made
        folder.parent.rmdir()


def stored_path(upload: RenderUpload) -> Path:
    return upload.folder_path().joinpath(*STORED_AS[upload.kind].parts)


def kind_of(name: str) -> str:
    kind = KINDS.get(PurePosixPath(name).suffix.lower())
    if kind is None:
        raise Refused(
            400,
            f"'{name[:100]}' is neither a .blend file nor a .zip; upload the scene's .blend, "
            "or a .zip holding it with its assets.",
        )
    return kind


def begin(owner: User, name: str, length: int) -> RenderUpload:
    """A new upload of ``length`` bytes named ``name``, its empty file made in a new folder of its owner's and its
    length counted toward their storage quota at once; Refused (in words) for a name that is no scene, a size past
    the limit, a person at one of their limits, or an upload that would pass their quota."""
    kind = kind_of(name)
    if length > settings.RENDER_MAX_UPLOAD_BYTES:
        raise Refused(
            413, f"The file is larger than {size_words(settings.RENDER_MAX_UPLOAD_BYTES)}, the most a scene may be."
        )
    limits.take_upload(owner)
    upload = RenderUpload(
        owner=owner,
        token=secrets.token_hex(16),
        folder=f"{owner_folder(owner)}/{secrets.token_hex(16)}",
        name=name[:255],
        kind=kind,
        length=length,
        sha256="" if length else hashlib.sha256().hexdigest(),  # an empty file is complete from the start
    )
    with transaction.atomic():  # the quota is checked and the upload reserved under the person's lock
        storage.check_upload(owner, length)
        _create(stored_path(upload))
        try:
            upload.save(force_insert=True)
            storage.reserve_upload(upload)
        except BaseException:
            remove_folder(upload.folder_path())
            raise
    return upload


def _create(target: Path) -> None:
    for _attempt in range(2):  # another upload's discard may remove the person's empty folder meanwhile
        try:
            make_private(target.parent)
            os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o640))
            return
        except FileNotFoundError:
            continue
    raise Refused(503, "The portal could not store the upload; try again.")


def find(owner: User, token: str) -> RenderUpload:
    """One of the person's uploads by its address; Refused 404 for anyone else's, as for one that never was."""
    upload = RenderUpload.objects.filter(owner=owner, token=token).first()
    if upload is None:
        raise Refused(404, "No such upload: it was finished, cancelled or expired. Upload the file again.")
    return upload


def append(owner: User, token: str, offset: int, part: Readable, size: int) -> RenderUpload:
    """Write ``size`` bytes read from ``part`` at ``offset`` of the upload, under its row's lock (two parts sent at
    once are written one after the other, the second refused at its stale offset)."""
    if size > settings.RENDER_UPLOAD_PART_BYTES:
        raise Refused(413, f"A part may hold at most {size_words(settings.RENDER_UPLOAD_PART_BYTES)}.")
    with transaction.atomic():
        upload = RenderUpload.objects.select_for_update().filter(owner=owner, token=token).first()
        if upload is None:
            raise Refused(404, "No such upload: it was finished, cancelled or expired. Upload the file again.")
        if offset != upload.offset:
            raise Refused(409, f"This part starts at byte {offset}, but {upload.offset} bytes are stored.")
        if offset + size > upload.length:
            raise Refused(400, f"The file was said to be {upload.length} bytes long; this part goes past its end.")
        _write(upload, part, size)
        upload.updated_at = timezone.now()
        upload.save(update_fields=["offset", "sha256", "updated_at"])
    return upload


def _write(upload: RenderUpload, part: Readable, size: int) -> None:
    path = stored_path(upload)
    digest = DIGESTS.take(upload.token, upload.offset, path)
    descriptor = os.open(path, os.O_WRONLY | os.O_NOFOLLOW)
    with os.fdopen(descriptor, "wb") as out:
        out.seek(upload.offset)
        written = 0
        while written < size:
            data = part.read(min(_READ, size - written))
            if not data:
                raise Refused(400, "The part ended before the length it declared.")
            out.write(data)
            digest.update(data)
            written += len(data)
        out.truncate()  # whatever a part cut off before this one left past it
    upload.offset += size
    if upload.complete:
        upload.sha256 = digest.hexdigest()
    else:
        DIGESTS.keep(upload.token, upload.offset, digest)


def discard(upload: RenderUpload) -> None:
    """Its owner cancelled it (or it expired): the folder, the row and its share of the quota go."""
    remove_folder(upload.folder_path())
    with transaction.atomic():
        RenderUpload.objects.filter(pk=upload.pk).delete()
        storage.upload_gone(upload)


def remove_expired(now: datetime | None = None) -> int:
    """Uploads nobody has added to for PORTAL_RENDER_UPLOAD_EXPIRY_HOURS: removed with what they stored."""
    cutoff = (now or timezone.now()) - timedelta(hours=settings.RENDER_UPLOAD_EXPIRY_HOURS)
    expired = list(RenderUpload.objects.filter(updated_at__lt=cutoff))
    for upload in expired:
        discard(upload)
    return len(expired)


class RunningDigests:
    """The running SHA-256 of uploads whose parts this process wrote, each with the offset it has reached. One
    not found (its last part went to another process, or this one restarted) is hashed again from disk."""

    def __init__(self, most: int = 256) -> None:
        self.most = most
        self._lock = threading.Lock()
        self._found: OrderedDict[str, tuple[int, Any]] = OrderedDict()

    def take(self, token: str, offset: int, path: Path) -> Any:
        with self._lock:
            found = self._found.pop(token, None)
        if found is not None and found[0] == offset:
            return found[1]
        digest = hashlib.sha256()
        with path.open("rb") as stored:
            left = offset
            while left > 0 and (data := stored.read(min(_READ, left))):
                digest.update(data)
                left -= len(data)
        return digest

    def keep(self, token: str, offset: int, digest: Any) -> None:
        with self._lock:
            self._found[token] = (offset, digest)
            while len(self._found) > self.most:
                self._found.popitem(last=False)


DIGESTS = RunningDigests()
