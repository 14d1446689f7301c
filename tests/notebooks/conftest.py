"""What notebook tests need: the hub's OAuth client, an image on the list, a simulated MIG fleet."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from portal.sso.clients import register_hub_client
from sessions.notebooks.models import NotebookImage, NotebookSession
from tests.gpus.conftest import use_fleet


@pytest.fixture
def notebook_image(db: None, settings) -> NotebookImage:  # type: ignore[no-untyped-def]
    use_fleet(settings, "nb: 1xH200:mig, 1xL4:whole")
    register_hub_client()
    image, _ = NotebookImage.objects.get_or_create(
        name="JupyterLab", defaults={"image": "gpu-portal/notebook:latest", "default": True}
    )
    return image


def wait_for(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def state_of(session: NotebookSession) -> str:
    session.refresh_from_db()
    return session.state
