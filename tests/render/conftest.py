"""Render tests: a render folder of the test's own (so 'nothing left on disk' is checked on an empty
folder), a small simulated fleet to pick an offer from, and a client that posts the upload form."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from django.urls import reverse

from sessions.gpus.backends import get_backend

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


@pytest.fixture
def post_scene(alice_client: Client, render_dir: Path, fleet: None) -> Upload:
    """Post the upload form as alice, the scene last (as browsers send it)."""

    def post(name: str, data: bytes, client: Client | None = None, **overrides: object) -> Any:
        fields = form_fields(**overrides)
        fields["scene"] = SimpleUploadedFile(name, data, content_type="application/octet-stream")
        return (client or alice_client).post(reverse("render-job-upload"), fields)

    return post


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
