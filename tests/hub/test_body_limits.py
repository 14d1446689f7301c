"""Bodies of several GiB sent to the public entry as make run starts it (compose/hub/proxy.py in front of a
daphne of this module's own, the Celery worker beside them): each is refused with 413 within seconds of
passing its limit, whatever the route, anonymous or logged in, with Content-Length or chunked, and no
portal process's memory passes its bound meanwhile. A scene of 1 GiB, sent as the page sends it (in parts),
goes through, resumes after its connection is cut, and becomes a job once its SHA-256 is checked.

Daphne holds a whole body in memory before any view runs (twisted reads it, then daphne queues all of it for
the application), so the bound on its memory is the entry's limit: nothing larger may reach it.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import socket
import struct
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.test import Client

from portal.entrylimits import UPLOAD_PATH
from sessions.render import jobs, uploads
from sessions.render.models import RenderJob, RenderUpload
from tests.gpus.conftest import use_fleet
from tests.helpers.bodies import MiB, Sent, send_body, watching
from tests.helpers.tus import HttpUploader
from tests.helpers.waiting import wait_for
from tests.hub.conftest import BOUNDS, TOKEN, Entry

pytestmark = [pytest.mark.hub, pytest.mark.celery]
ROOT = Path(__file__).resolve().parents[2]
GiB = 1024 * MiB
SEVERAL_GIB = 4 * GiB
WITHIN_SECONDS = 5


def session_cookie(user: User) -> dict[str, str]:
    client = Client()
    client.force_login(user)
    return {"Cookie": f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"}


def sent_through(entry: Entry, path: str, limit: int, chunked: bool, headers: dict[str, str]) -> tuple[Sent, str]:
    with watching(entry.pids) as watch:
        sent = send_body(
            entry.port,
            path,
            SEVERAL_GIB,
            limit=limit,
            chunked=chunked,
            headers=headers,
            give_up=lambda: watch.over(BOUNDS),
        )
    return sent, watch.over(BOUNDS)


ROUTES = {"the upload route": UPLOAD_PATH + "0123456789abcdef0123456789abcdef/", "another route": "/sessions/"}


def limit_for(route: str, logged_in: bool) -> int:
    limits = settings.ENTRY_LIMITS
    if not logged_in:
        return limits.anonymous
    return limits.upload_route if route == "the upload route" else limits.form


@pytest.mark.parametrize("chunked", [True, False], ids=["chunked", "content-length"])
@pytest.mark.parametrize("logged_in", [False, True], ids=["anonymous", "logged-in"])
@pytest.mark.parametrize("route", list(ROUTES))
def test_a_body_of_several_gib_is_refused_within_seconds_of_its_limit_and_memory_stays_bounded(
    entry: Entry, alice: User, transactional_db: None, route: str, logged_in: bool, chunked: bool
) -> None:
    limit = limit_for(route, logged_in)
    headers = session_cookie(alice) if logged_in else {}
    sent, over = sent_through(entry, ROUTES[route], limit, chunked, headers)
    assert not over, f"memory passed its bound after {sent.sent / MiB:.0f} MiB sent: {over}"
    assert sent.status == 413, f"{sent.stopped or 'answered'} after {sent.sent / MiB:.0f} MiB: {sent.answer[:300]!r}"
    assert b"too large" in sent.answer.lower()
    if chunked:
        assert sent.seconds_after_limit() < WITHIN_SECONDS
        assert sent.sent < limit + 64 * MiB  # what the sockets' buffers held when the refusal came
    else:
        assert sent.sent < 64 * MiB  # the declared length was refused before the body was read


class Discard(http.server.BaseHTTPRequestHandler):
    """A notebook server's stand-in: reads a body and throws it away."""

    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        if self.headers.get("Transfer-Encoding") == "chunked":
            while (size := int(self.rfile.readline().split(b";")[0], 16)) > 0:
                self._skip(size + 2)
            self.rfile.readline()
        else:
            self._skip(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def _skip(self, count: int) -> None:
        while count > 0:
            count -= len(self.rfile.read(min(count, MiB)) or b"x" * count)

    def log_message(self, *args: object) -> None:
        return


@pytest.fixture
def jupyter_route(entry: Entry) -> Iterator[str]:
    """/jupyter/ routed to a server that is not the portal, as the hub routes it."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Discard)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    route = urllib.request.Request(
        entry.api + "/api/routes/jupyter",
        data=json.dumps({"target": f"http://127.0.0.1:{server.server_address[1]}"}).encode(),
        headers={"Authorization": f"token {TOKEN}"},
        method="POST",
    )
    urllib.request.urlopen(route, timeout=5).close()
    yield "/jupyter/user/alice/api/contents/big.bin"
    delete = urllib.request.Request(
        entry.api + "/api/routes/jupyter", headers={"Authorization": f"token {TOKEN}"}, method="DELETE"
    )
    urllib.request.urlopen(delete, timeout=5).close()
    server.shutdown()


def test_jupyterlab_gets_its_own_generous_limit_and_a_body_past_it_is_refused(entry: Entry, jupyter_route: str) -> None:
    part = send_body(entry.port, jupyter_route, 3 * MiB // 2, limit=settings.ENTRY_LIMITS.jupyter, chunked=False)
    assert part.status == 200, part.answer[:300]  # a part of a JupyterLab upload, base64 in JSON
    limit = settings.ENTRY_LIMITS.jupyter
    started = time.monotonic()
    sent, over = sent_through(entry, jupyter_route, limit, chunked=True, headers={})
    assert not over, over
    assert sent.status == 413 and sent.seconds_after_limit() < WITHIN_SECONDS, sent
    assert limit <= sent.sent < limit + 64 * MiB
    assert time.monotonic() - started < 60


def test_a_body_sent_while_the_hub_is_away_is_held_to_the_portals_limit(entry: Entry) -> None:
    """With no /jupyter/ route (the hub down, or the entry just restarted) /jupyter/ reaches the portal: it gets
    the portal's limit, not JupyterLab's, since it is daphne that would hold it."""
    sent, over = sent_through(entry, "/jupyter/hub/api/users", settings.ENTRY_LIMITS.anonymous, True, {})
    assert not over, over
    assert sent.status == 413 and sent.sent < settings.ENTRY_LIMITS.anonymous + 64 * MiB


def test_bodies_within_the_limits_still_reach_the_portal(entry: Entry, alice: User, transactional_db: None) -> None:
    login = send_body(entry.port, "/accounts/login/", 2048, limit=2048, chunked=False)
    assert login.status == 403  # a small anonymous body reaches Django, whose CSRF check refuses this one
    posted = send_body(entry.port, "/sessions/", MiB, limit=MiB, chunked=True, headers=session_cookie(alice))
    assert posted.status in (403, 405), posted.answer[:300]  # Django answered, not the entry


@pytest.mark.docker
def test_the_proxy_the_hub_starts_is_the_gate_too(hub: str) -> None:
    port = int(hub.rsplit(":", 1)[1])
    sent = send_body(port, "/sessions/", SEVERAL_GIB, limit=settings.ENTRY_LIMITS.anonymous, chunked=True)
    assert sent.status == 413 and sent.sent < settings.ENTRY_LIMITS.anonymous + 64 * MiB, sent
    declared = send_body(
        port, "/jupyter/hub/api/users", SEVERAL_GIB, limit=settings.ENTRY_LIMITS.jupyter, chunked=False
    )
    assert declared.status == 413 and declared.sent < 64 * MiB, declared


GIB_SCENE = 1024 * MiB


class BigScene:
    """A .blend of ``size`` bytes made on the fly: its header, a small DNA1 block, one large block of bytes that
    change with every part (a part stored twice or in the wrong place changes the file's hash), the end block."""

    def __init__(self, size: int, part: int) -> None:
        head = struct.Struct("<4siQii")
        self.part = part
        self.start = b"BLENDER-v304" + head.pack(b"DNA1", 16, 1, 0, 1) + bytes(16)
        self.end = head.pack(b"ENDB", 0, 0, 0, 0)
        self.start += head.pack(b"DATA", size - len(self.start) - head.size - len(self.end), 2, 0, 1)
        self.size = size

    def __call__(self, offset: int, size: int) -> bytes:
        body = bytes([offset // self.part % 251 + 1]) * size
        data = bytearray(body)
        if offset < len(self.start):
            data[: len(self.start) - offset] = self.start[offset : offset + size]
        if offset + size > self.size - len(self.end):
            at = self.size - len(self.end)
            data[max(0, at - offset) :] = self.end[max(0, offset - at) :]
        return bytes(data)


def test_an_upload_of_1_gib_goes_through_the_public_address_resumes_after_a_cut_and_is_checked_against_its_hash(
    entry: Entry, alice: User, transactional_db: None, settings
) -> None:  # type: ignore[no-untyped-def]
    use_fleet(settings, settings.SIMULATED_FLEET)
    part = settings.RENDER_UPLOAD_PART_BYTES
    scene = BigScene(GIB_SCENE, part)
    uploader = HttpUploader(entry.port, session_cookie(alice)["Cookie"])
    digest, cut_at = hashlib.sha256(), GIB_SCENE // part // 3 * part
    with watching(entry.pids) as watch:
        created = uploader.begin("big.blend", GIB_SCENE)
        assert created.status == 201
        location = created.headers["Location"]
        for offset in range(0, cut_at, part):
            assert uploader.send(location, offset, scene(offset, part)).status == 204
        uploader.cut_off(location, cut_at, scene(cut_at, part))  # the connection drops mid-part
        assert uploader.offset(location) == cut_at  # nothing of the cut part was kept: it is sent again whole
        for offset in range(cut_at, GIB_SCENE, part):
            assert uploader.send(location, offset, scene(offset, part)).status == 204
    assert not watch.over(BOUNDS), watch.over(BOUNDS)
    for offset in range(0, GIB_SCENE, part):
        digest.update(scene(offset, part))
    upload = RenderUpload.objects.get(owner=alice)
    assert (upload.offset, upload.sha256) == (GIB_SCENE, digest.hexdigest())
    token = location.rstrip("/").rsplit("/", 1)[1]
    try:
        answer = uploader.form(token, digest.hexdigest())
        assert answer.status == 302, answer.status
        job = RenderJob.objects.get(owner=alice)
        assert job.upload_bytes == GIB_SCENE
        wait_for(lambda: RenderJob.objects.get(pk=job.pk).state != "unpacking", 120, "its check by the worker")
        job.refresh_from_db()
        assert job.state in ("validated", "estimating"), job.failure_message  # every block to the end was there
    finally:
        for left in RenderJob.objects.filter(owner=alice):
            jobs.remove_files(left)
        uploads.remove_folder(upload.folder_path())


def test_a_body_that_asks_to_continue_is_refused_instead_of_invited(
    entry: Entry, alice: User, transactional_db: None
) -> None:
    """curl and other clients ask first ("Expect: 100-continue") and send the body only once invited."""
    cookie = session_cookie(alice)["Cookie"]
    head = f"POST /sessions/ HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {SEVERAL_GIB}\r\n"
    head += f"Expect: 100-continue\r\nCookie: {cookie}\r\n\r\n"
    with socket.create_connection(("127.0.0.1", entry.port), timeout=10) as connection:
        connection.sendall(head.encode())
        answer = connection.recv(4096)
    assert answer.startswith(b"HTTP/1.1 413 "), answer[:200]
    small = "POST /sessions/ HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 10\r\nExpect: 100-continue\r\n\r\n"
    with socket.create_connection(("127.0.0.1", entry.port), timeout=10) as connection:
        connection.sendall(small.encode())
        assert connection.recv(4096).startswith(b"HTTP/1.1 100 Continue"), "a body within the limit is invited"
