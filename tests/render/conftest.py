"""Render tests: a render folder of the test's own (so 'nothing left on disk' is checked on an empty
folder), a small simulated fleet to pick an offer from, and a client that uploads a scene in parts (tus) and
posts the form that names it."""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from sessions.gpus.backends import get_backend
from sessions.render import unpacking
from sessions.render.models import RenderJob

OFFER = "mig:H200-SXM5-141GB:1g.18gb"
Upload = Callable[..., Any]


@pytest.fixture
def render_dir(settings, tmp_path: Path) -> Path:  # type: ignore[no-untyped-def]
    folder = tmp_path / "render"
    folder.mkdir()
    settings.RENDER_DIR = folder
    return folder


@pytest.fixture
def fleet(db: None, settings) -> Iterator[None]:  # type: ignore[no-untyped-def]
    from tests.gpus.conftest import use_fleet

    use_fleet(settings, "r: 1xH200:mig")
    yield
    get_backend.cache_clear()


def stored(render_dir: Path) -> list[str]:
    """Everything under the render folder: what an upload left behind."""
    return sorted(str(path.relative_to(render_dir)) for path in render_dir.rglob("*"))


def form_fields(**overrides: object) -> dict[str, object]:
    fields: dict[str, object] = {
        "frames": "1-10",
        "resolution_percent": "50",
        "samples": "",
        "output_format": "PNG",
        "offer": OFFER,
        "chunk_size": "4",
        "max_slices": "1",
        "main_file": "",
    }
    fields.update(overrides)
    return fields


TUS = {"Tus-Resumable": "1.0.0"}
PART = 64 * 1024


def begin_upload(client: Client, name: str, length: int) -> Any:
    """The tus creation request for a file of ``length`` bytes named ``name``."""
    metadata = "filename " + base64.b64encode(name.encode()).decode()
    headers = {**TUS, "Upload-Length": str(length), "Upload-Metadata": metadata}
    return client.post(reverse("render-upload-create"), b"", content_type="", headers=headers)


def send_part(client: Client, token: str, offset: int, data: bytes) -> Any:
    return client.generic(
        "PATCH",
        reverse("render-upload-part", args=[token]),
        data,
        content_type="application/offset+octet-stream",
        headers={**TUS, "Upload-Offset": str(offset)},
    )


def upload_file(client: Client, name: str, data: bytes, part: int = PART) -> str:
    """Send ``data`` up as the page's script does, in parts; returns the upload's token."""
    created = begin_upload(client, name, len(data))
    assert created.status_code == 201, created.content.decode()
    token = str(created["Location"]).rstrip("/").rsplit("/", 1)[1]
    for offset in range(0, len(data), part):
        answer = send_part(client, token, offset, data[offset : offset + part])
        assert answer.status_code == 204, answer.content.decode()
    return token


def sha256_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def post_scene(alice_client: Client, render_dir: Path, fleet: None) -> Upload:
    """Upload a scene as alice in parts, then send the form that names it (with the file's SHA-256)."""

    def post(name: str, data: bytes, client: Client | None = None, sha256: str = "", **overrides: object) -> Any:
        client = client or alice_client
        fields = form_fields(**overrides)
        fields["upload"] = upload_file(client, name, data)
        fields["sha256"] = sha256 or sha256_of(data)
        return client.post(reverse("render-job-upload"), fields)

    return post


def unpacked(job: RenderJob) -> RenderJob:
    """What the unpacking task does with the job (the tests here run no worker)."""
    unpacking.unpack(job.pk)
    return RenderJob.objects.get(pk=job.pk)


@pytest.fixture
def bob_client(bob: User) -> Client:
    client = Client()
    client.force_login(bob)
    return client


@pytest.fixture
def staff_client(staff: User) -> Client:
    client = Client()
    client.force_login(staff)
    return client


def waiting_on(queue: str) -> list[list[int]]:
    """The arguments of the tasks waiting on a broker queue (taken off it)."""
    from portal.celery import app

    found = []
    with app.connection_for_write() as connection:
        while (message := connection.default_channel.basic_get(queue, no_ack=True)) is not None:
            found.append(list(message.decode()[0]))
    return found
