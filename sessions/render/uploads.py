"""A scene upload, streamed to disk as it arrives, into a new job folder that is removed unless a job keeps it.

The body is never held in memory: the upload handler writes each chunk to the job folder and stops the
upload the moment it passes PORTAL_RENDER_MAX_UPLOAD_BYTES, removing what it wrote. Folders are named
so nobody can guess another person's: ``<keyed hash of the person>/<random name>`` below
PORTAL_RENDER_DIR.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import secrets
import shutil
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO

from django.conf import settings
from django.contrib.auth.models import User
from django.core.files.uploadedfile import UploadedFile
from django.core.files.uploadhandler import FileUploadHandler, SkipFile, StopUpload

from sessions.render.files import make_private
from sessions.render.scenefile import size_words

FIELD = "scene"  # the form field the scene comes in; any other file in the body is skipped
# Room for the form's other fields and the multipart framing, on top of the file itself.
FORM_ALLOWANCE = 64 * 1024
KINDS = {".blend": "blend", ".zip": "zip"}
# Where each kind is written inside the job folder: a .blend is the scene itself, a zip is unpacked.
STORED_AS = {"blend": PurePosixPath("scene/scene.blend"), "zip": PurePosixPath("upload.zip")}


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


class Upload:
    """One upload in flight: where it goes, what has arrived, and why it was refused (if it was)."""

    def __init__(self, owner: User, limit: int | None = None) -> None:
        self.limit = settings.RENDER_MAX_UPLOAD_BYTES if limit is None else limit
        self.relative = f"{owner_folder(owner)}/{secrets.token_hex(16)}"
        self.folder = Path(settings.RENDER_DIR) / self.relative
        self.refusal = ""
        self.name = ""
        self.kind = ""
        self.size = 0
        self.path: Path | None = None
        self.complete = False  # every byte of the scene arrived
        self.kept = False
        self._out: BinaryIO | None = None

    def refuse(self, message: str) -> StopUpload:
        """Note why, remove what was written, and give the exception that stops the upload. The rest of
        the body is read and dropped, so the browser gets the form back with the message."""
        self.refusal = self.refusal or message
        self.discard()
        return StopUpload(connection_reset=False)

    def too_big(self) -> str:
        return f"The file is larger than {size_words(self.limit)}, the most a scene upload may be."

    def open(self, name: str, kind: str) -> None:
        target = self.folder / STORED_AS[kind]
        self._out = os.fdopen(self._create(target), "wb")
        self.name, self.kind, self.path = name, kind, target

    def _create(self, target: Path) -> int:
        for _attempt in range(2):  # another upload's discard may remove the person's empty folder meanwhile
            try:
                make_private(target.parent)
                return os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o640)
            except FileNotFoundError:
                continue
        raise self.refuse("The portal could not store the upload; try again.")

    def write(self, data: bytes) -> None:
        self.size += len(data)
        if self.size > self.limit:
            raise self.refuse(self.too_big())
        assert self._out is not None
        self._out.write(data)
        self._out.flush()  # on disk as it arrives, not in a buffer of ours

    def close(self) -> None:
        if self._out is not None:
            self._out.close()
            self._out = None

    def keep(self) -> None:
        """A job now owns the folder: it stays."""
        self.kept = True

    def discard(self) -> None:
        """Remove whatever this upload wrote, and the person's folder if nothing else is in it."""
        self.close()
        self.path = None
        remove_folder(self.folder)

    def discard_unless_kept(self) -> None:
        if not self.kept:
            self.discard()


class StoredScene(UploadedFile):
    """What the form receives for the scene field: its name and size; the bytes are already on disk."""

    def __init__(self, upload: Upload) -> None:
        super().__init__(file=None, name=upload.name, content_type="application/octet-stream", size=upload.size)
        self.upload = upload

    def close(self) -> None:
        """Nothing is open: the upload's own file was closed when it completed."""


class SceneUploadHandler(FileUploadHandler):
    """Django's upload handler for the scene field: each chunk goes straight to the job folder."""

    chunk_size = 1024 * 1024

    def __init__(self, upload: Upload, request: Any = None) -> None:
        super().__init__(request)
        self.upload = upload

    def handle_raw_input(
        self, input_data: Any, META: dict[str, Any], content_length: int, boundary: Any, encoding: Any = None
    ) -> None:
        # A body that says up front it is too big is refused before its first byte is written.
        if content_length > self.upload.limit + FORM_ALLOWANCE:
            self.upload.refusal = self.upload.too_big()

    def new_file(self, field_name: str, file_name: str, *args: Any, **kwargs: Any) -> None:
        super().new_file(field_name, file_name, *args, **kwargs)
        if field_name != FIELD:
            raise SkipFile()
        if self.upload.refusal:
            raise StopUpload(connection_reset=False)
        if self.upload.path is not None:
            raise self.upload.refuse("Upload one file per job: a .blend, or one .zip holding the scene.")
        kind = KINDS.get(PurePosixPath(file_name).suffix.lower())
        if kind is None:
            raise self.upload.refuse(
                f"'{file_name[:100]}' is neither a .blend file nor a .zip; upload the scene's .blend, "
                "or a .zip holding it with its assets."
            )
        self.upload.open(file_name[:255], kind)

    def receive_data_chunk(self, raw_data: bytes, start: int) -> None:
        self.upload.write(raw_data)

    def file_complete(self, file_size: int) -> StoredScene | None:
        if self.upload.path is None:
            return None
        self.upload.close()
        self.upload.complete = True
        return StoredScene(self.upload)

    def upload_interrupted(self) -> None:
        # Django also calls this when a part after the scene was skipped: only a cut scene is removed.
        if not self.upload.complete:
            self.upload.discard()
