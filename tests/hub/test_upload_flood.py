"""One person begins 10,000 tiny uploads within a minute through the public address: past the rate each is
answered 429 with Retry-After and words, the portal stays responsive to someone else meanwhile, no process's
memory passes its bound, and nothing of a refused upload is on disk."""

from __future__ import annotations

import base64
import http.client
import statistics
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from django.conf import settings
from django.contrib.auth.models import User

from sessions.render.models import RenderUpload
from sessions.render.uploads import owner_folder
from tests.helpers.bodies import watching
from tests.helpers.tus import HttpUploader
from tests.helpers.websockets import session_cookie
from tests.hub.conftest import BOUNDS, Entry

pytestmark = [pytest.mark.hub, pytest.mark.celery]
UPLOADS = 10_000
SENDERS = 16
METADATA = "filename " + base64.b64encode(b"tiny.blend").decode()


class Flood:
    """Many connections, each beginning uploads one after the other as fast as answers come."""

    def __init__(self, entry: Entry, cookie: str) -> None:
        self.uploader = HttpUploader(entry.port, cookie)
        self.port = entry.port
        self.statuses: Counter[int] = Counter()
        self.unworded: list[str] = []
        self.lock = threading.Lock()

    def send(self, count: int) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        headers = self.uploader.headers(Upload_Length="1", Upload_Metadata=METADATA)
        for _ in range(count):
            connection.request("POST", "/sessions/render-jobs/uploads/", headers=headers)
            answer = connection.getresponse()
            words = answer.read().decode()
            with self.lock:
                self.statuses[answer.status] += 1
                if answer.status == 429 and not (
                    answer.headers.get("Retry-After", "").isdigit() and "try again" in words
                ):
                    self.unworded.append(words)


def test_ten_thousand_tiny_uploads_in_a_minute_are_answered_429_past_the_rate_and_the_portal_stays_responsive(
    entry: Entry, alice: User, bob: User, transactional_db: None
) -> None:
    flood = Flood(entry, session_cookie(alice))
    waits: list[float] = []
    stop = threading.Event()

    bobs = {"Cookie": session_cookie(bob)}

    def someone_else() -> None:
        """Bob loads his render jobs page twice a second meanwhile."""
        connection = http.client.HTTPConnection("127.0.0.1", entry.port, timeout=30)
        while not stop.is_set():
            started = time.monotonic()
            connection.request("GET", "/sessions/render-jobs/", headers=bobs)
            answer = connection.getresponse()
            answer.read()
            assert answer.status == 200
            waits.append(time.monotonic() - started)
            stop.wait(0.5)

    senders = [threading.Thread(target=flood.send, args=(UPLOADS // SENDERS,)) for _ in range(SENDERS)]
    watcher = threading.Thread(target=someone_else)
    started = time.monotonic()
    with watching(entry.pids, every=0.1) as watch:
        watcher.start()
        for sender in senders:
            sender.start()
        for sender in senders:
            sender.join()
        took = time.monotonic() - started
        stop.set()
        watcher.join()

    allowed = settings.RENDER_UPLOADS_PER_WINDOW
    assert sum(flood.statuses.values()) == UPLOADS and took < 60, (flood.statuses, took)
    assert set(flood.statuses) == {201, 429}, flood.statuses  # every one refused is refused as a rate
    assert allowed <= flood.statuses[201] <= 2 * allowed  # twice, where the minute spans two windows
    assert not flood.unworded, flood.unworded[:3]
    assert max(waits) < 2 and statistics.median(waits) < 0.5, sorted(waits)[-5:]
    assert not watch.over(BOUNDS), watch.over(BOUNDS)
    # On disk: the uploads begun, each an empty file in a folder of its own; nothing of the refused ones.
    folders = sorted((Path(settings.RENDER_DIR) / owner_folder(alice)).iterdir())
    kept = RenderUpload.objects.filter(owner=alice)
    assert len(folders) == kept.count() == flood.statuses[201]
    assert {folder.name for folder in folders} == {upload.folder.split("/")[1] for upload in kept}
    assert all([path.name for path in folder.rglob("*")] == ["scene", "scene.blend"] for folder in folders)
    for upload in kept:
        assert flood.uploader.request("DELETE", f"/sessions/render-jobs/uploads/{upload.token}/").status == 204
    assert not (Path(settings.RENDER_DIR) / owner_folder(alice)).exists()
