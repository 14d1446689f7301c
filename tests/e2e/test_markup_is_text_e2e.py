"""Markup in anything that reaches a page is shown as text and never runs, in Chromium.

A notebook user can write to Redis and, once anything slips, to rows the portal
shows; so every such field gets markup here: rows in the database (host, GPU
model, slice holder, user and session names, messages, images, heartbeats),
the latest fleet frame in Redis (the attack from issue 11), frames published on
the channel layer, and the real agent's frames, which carry the database's host
and user names. Each payload would set ``window.__pwned`` and open a dialog if
it ran; the page must show it literally, with no element made from it.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis
from django.conf import settings
from django.contrib.auth.models import User
from django.utils import timezone
from playwright.sync_api import Page, expect

from portal import push
from portal.models import WorkerHeartbeat
from portal.roles import OPERATORS, USERS
from sessions.gpus.allocator import SliceRequest, allocate
from sessions.gpus.models import Gpu, GpuHost
from sessions.metrics.agent import LATEST_TTL_S, latest_key
from sessions.metrics.frames import dumps
from sessions.notebooks.models import NotebookImage, NotebookSession
from tests.conftest import ARTIFACTS
from tests.e2e.conftest import SCREENSHOTS, log_in
from tests.factories import make_user, running_session
from tests.gpus.conftest import use_fleet
from tests.helpers import processes
from tests.helpers.page_watch import PageWatch

pytestmark = pytest.mark.django_db(transaction=True)
FLEET = "xss: 1xH200:mig, 1xL4:whole"
# What the payloads would make if parsed as markup; our pages have no inline script and no src=x image.
MADE_FROM_MARKUP = "img[src='x'], [onerror], body script:not([src]):not([type='application/json'])"


def img(name: str) -> str:
    """An element whose error handler would run: the payload of issue 11."""
    return f"<img src=x onerror=\"__pwned='{name}';alert('{name}')\">"


def script(name: str) -> str:
    return f"<script>__pwned='{name}';alert('{name}')</script>"


@dataclass
class Hostile:
    """The rows carrying markup, and the text each page must show literally."""

    session: NotebookSession
    mig_gpu: Gpu
    odd_gpu: Gpu
    shows: dict[str, list[str]] = field(default_factory=dict)


@pytest.fixture
def hostile(settings, alice: User, staff: User, notebook_image: NotebookImage) -> Hostile:  # type: ignore[no-untyped-def]
    settings.MAX_SLICES_PER_USER = 10
    use_fleet(settings, FLEET)
    mig_gpu = Gpu.objects.get(host__name="xss", model_name__startswith="H200")
    odd_gpu = Gpu.objects.get(host__name="xss", model_name__startswith="L4")

    alice.first_name, alice.last_name = img("first name"), script("last name")
    alice.save(update_fields=["first_name", "last_name"])
    # Usernames are validated in every form; one that got into the database some other way must still be text.
    mallory = make_user(img("username"), [USERS])
    image = NotebookImage.objects.create(name=img("image"), image="gpu-portal/notebook:latest", description=script("d"))
    session = running_session(alice, image, SliceRequest("mig", "2g.35gb", host="xss"), "lab")
    NotebookSession.objects.filter(pk=session.pk).update(display_name=img("display name"))
    NotebookSession.objects.create(
        owner=alice,
        server_name="starting",
        image=image,
        state=NotebookSession.State.STARTING,
        progress=40,
        progress_message=img("progress"),
        warning=script("warning"),
    )
    NotebookSession.objects.create(
        owner=alice,
        server_name="broken",
        image=image,
        state=NotebookSession.State.FAILED,
        failure_message=img("failure"),
    )
    allocate(mallory, SliceRequest("mig", "1g.18gb", host="xss"))  # a holder is a kind and an id: no text to carry
    GpuHost.objects.filter(name="xss").update(
        name=img("host"), problem=script("host problem"), driver_version=img("drv")
    )
    # Discovery marks a GPU whose model the catalog lacks as an error, with the driver's name in the detail.
    Gpu.objects.filter(pk=odd_gpu.pk).update(
        model_name=img("model"), state=Gpu.State.ERROR, state_detail=script("state detail")
    )
    WorkerHeartbeat.objects.create(name=img("heartbeat"), seen_at=timezone.now())

    mine = [img("first name"), script("warning")]
    cards = [img("image"), img("progress"), img("failure"), img("host")]
    fleet = [img("host"), script("host problem"), img("drv"), img("model"), script("state detail")]
    return Hostile(
        session,
        mig_gpu,
        odd_gpu,
        shows={
            "/": mine,
            "/sessions/": cards,
            f"/sessions/{session.pk}/": [img("image"), img("host")],
            "/sessions/fleet/": fleet,
            "/sessions/all/": [img("host")],
            f"/sessions/fleet/gpus/{mig_gpu.pk}/": [img("host"), img("username")],
            f"/sessions/fleet/gpus/{odd_gpu.pk}/": [img("host"), img("model"), script("state detail")],
        },
    )


@pytest.fixture
def agent(hostile: Hostile) -> Iterator[None]:
    """The real agent, started after the rows: it reads host names at start and holders every 2 s."""
    process = processes.start_gpu_agent(FLEET, ARTIFACTS / "logs" / "gpu-agent-xss.log")
    yield
    processes.stop(process)


def hostile_fleet_frame(tag: str) -> dict[str, Any]:
    """A fleet frame with markup in every field a tile shows, as a notebook could write it into Redis."""
    users = [{"user": img(f"{tag} user"), "session": None, "holder": script(f"{tag} holder")}]
    device = {"uuid": img(f"{tag} device uuid"), "gi": 1, "profile": img(f"{tag} profile"), "util": 30.0}
    device.update(mem_used=img("mem"), mem_total=2048.0, users=[{"user": script(f"{tag} device user"), "session": 0}])
    gpu = {
        "uuid": img(f"{tag} uuid"),
        "host": img(f"{tag} host"),
        "index": script(f"{tag} index"),
        "model": img(f"{tag} model"),
        "util": img("util"),
        "mem_used": 1024.0,
        "mem_total": 4096.0,
        "temp": script("temp"),
        "power": 100.0,
        "problem": script(f"{tag} problem"),
        "users": users,
        "devices": [device],
    }
    bare = dict(gpu, uuid=f"GPU-{tag}-bare", host=script(f"{tag} bare host"), devices=[])
    return {
        "kind": "fleet",
        "agent": img("agent"),
        "t": time.time(),
        "simulated": img("simulated"),
        "gpus": [gpu, bare],
    }


def hostile_texts(tag: str) -> list[str]:
    names = ["host", "model", "profile", "user"]
    return [img(f"{tag} {name}") for name in names] + [
        script(f"{tag} {name}") for name in ("index", "problem", "holder", "device user", "bare host")
    ]


class Publisher:
    """Sends a frame to a channel-layer group four times a second, from its own thread and event loop."""

    def __init__(self, group: str, frame: dict[str, Any]) -> None:
        self.group, self.frame = group, frame
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    async def _run(self) -> None:
        layer = push.metrics_layer()
        while not self.stopping.is_set():
            self.frame["t"] = time.time()
            await push.publish_frame(layer, self.group, dumps(self.frame), self.frame["t"], "test")
            await asyncio.sleep(0.25)
        await layer.flush()

    def __enter__(self) -> Publisher:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self.thread.join(timeout=5)


def assert_shows_as_text(page: Page, watch: PageWatch, where: str, texts: list[str]) -> None:
    for text in texts:
        expect(page.locator("body")).to_contain_text(text)
    expect(page.locator(MADE_FROM_MARKUP)).to_have_count(0)
    assert not watch.pwned(), f"{where}: markup ran ({page.evaluate('window.__pwned')!r})"
    watch.assert_clean(where)


def screenshot(page: Page, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"markup-{name}.png"), full_page=True)


def test_markup_in_the_database_shows_as_text_on_a_users_pages(
    portal_server: str, page: Page, hostile: Hostile
) -> None:
    watch = PageWatch.on(page)
    log_in(page, portal_server, "alice")
    for path in ("/", "/sessions/", f"/sessions/{hostile.session.pk}/"):
        page.goto(portal_server + path)
        page.wait_for_timeout(300)
        screenshot(page, "alice" + path.replace("/", "-").rstrip("-"))
        assert_shows_as_text(page, watch, path, hostile.shows[path])
    page.goto(portal_server + "/sessions/")
    expect(page.get_by_label("Image")).to_contain_text(img("image"))  # the launch form's choice, too


def test_markup_in_the_database_shows_as_text_on_the_fleet_and_admin_pages(
    portal_server: str, page: Page, hostile: Hostile
) -> None:
    watch = PageWatch.on(page)
    log_in(page, portal_server, "charlie")
    page.goto(portal_server + "/")
    assert_shows_as_text(page, watch, "staff dashboard", [img("heartbeat")])
    for path in (
        "/sessions/fleet/",
        "/sessions/all/",
        f"/sessions/fleet/gpus/{hostile.mig_gpu.pk}/",
        f"/sessions/fleet/gpus/{hostile.odd_gpu.pk}/",
    ):
        page.goto(portal_server + path)
        screenshot(page, "charlie" + path.replace("/", "-").rstrip("-"))
        assert_shows_as_text(page, watch, path, hostile.shows[path])

    make_user("root", [USERS, OPERATORS], is_staff=True, is_superuser=True)
    page.context.clear_cookies()
    log_in(page, portal_server, "root")
    for path, texts in (
        ("/admin/gpus/gpuhost/", [img("host"), img("drv")]),
        ("/admin/gpus/slice/", [img("username")]),
        ("/admin/notebooks/notebooksession/", [img("host")]),
        ("/admin/notebooks/notebookimage/", [img("image")]),
        ("/admin/auth/user/", [img("username"), img("first name"), script("last name")]),
    ):
        page.goto(portal_server + path)
        screenshot(page, "admin" + path.replace("/", "-").rstrip("-"))
        assert_shows_as_text(page, watch, path, texts)


def test_markup_in_live_frames_shows_as_text_on_the_live_fleet(
    portal_server: str, page: Page, hostile: Hostile, agent: None
) -> None:
    # The attack: a frame written straight into the latest-frame hash, which a page gets on connecting.
    store = redis.Redis.from_url(settings.REDIS_URL)
    store.hset(latest_key(), "written-by-a-notebook", dumps(hostile_fleet_frame("stored")))
    store.expire(latest_key(), LATEST_TTL_S)
    watch = PageWatch.on(page)
    log_in(page, portal_server, "charlie")
    with Publisher(push.fleet_metrics_group(), hostile_fleet_frame("published")):
        page.goto(portal_server + "/sessions/fleet/live/")
        tiles = page.locator("#fleet-tiles")
        # The agent's own frames carry the database's host name and the holder's owner's name (a holder
        # itself is a kind and an id, and the published frames below carry markup in its place).
        for text in (img("host"), img("username")):
            expect(tiles).to_contain_text(text, timeout=10000)
        page.wait_for_function("() => Number(document.getElementById('fleet-tiles').dataset.frames || 0) >= 8")
        screenshot(page, "fleet-live")
        assert_shows_as_text(page, watch, "live fleet", hostile_texts("stored") + hostile_texts("published"))
    expect(page.locator("[data-fleet-status]")).to_have_text("live")


def test_markup_in_a_personal_frame_runs_nothing_on_a_session_page(
    portal_server: str, page: Page, alice: User, hostile: Hostile
) -> None:
    session = hostile.session.pk
    device = {"uuid": img("uuid"), "session": session, "holder": img("holder"), "model": img("model")}
    device.update(profile=script("profile"), util=img("util"), mem_used=script("mem"), temp=None, power=12.5)
    watch = PageWatch.on(page)
    log_in(page, portal_server, "alice")
    with Publisher(push.user_metrics_group(alice.pk), {"kind": "mine", "t": 0, "devices": [device]}):
        page.goto(f"{portal_server}/sessions/{session}/")
        charts = page.locator("[data-live-session]")
        page.wait_for_function("() => Number(document.querySelector('[data-live-session]').dataset.points || 0) >= 2")
        # A figure that is not a number is "not reported", not NaN and never markup.
        expect(charts.locator("output[data-figure='util']")).to_have_text("n/a")
        expect(charts.locator("output[data-figure='power']")).to_have_text("12.5 W")
        screenshot(page, "session-personal-frame")
        assert_shows_as_text(page, watch, "session page", [])
