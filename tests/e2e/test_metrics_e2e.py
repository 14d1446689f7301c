"""Live GPU charts in Chromium: a session's page moves within seconds; the staff fleet page shows every device."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Page, expect

from sessions.gpus.allocator import SliceRequest, allocate
from sessions.gpus.holders import Holder
from sessions.notebooks.models import NotebookImage, NotebookSession
from tests.conftest import ARTIFACTS
from tests.e2e.conftest import SCREENSHOTS, log_in
from tests.factories import running_session
from tests.gpus.conftest import use_fleet
from tests.helpers import processes

pytestmark = pytest.mark.django_db(transaction=True)
FLEET = "live: 2xH200:mig, 1xL4:whole"


@pytest.fixture
def agent(settings, notebook_image: NotebookImage) -> Iterator[None]:  # type: ignore[no-untyped-def]
    use_fleet(settings, FLEET)
    process = processes.start_gpu_agent(FLEET, ARTIFACTS / "logs" / "gpu-agent-e2e.log")
    yield
    processes.stop(process)


def charted_session(user: User, image: NotebookImage) -> NotebookSession:
    return running_session(user, image, SliceRequest("mig", "2g.35gb", host="live"), "charts")


def test_a_session_page_charts_its_slice_live(
    portal_server: str, page: Page, alice: User, notebook_image: NotebookImage, agent: None
) -> None:
    session = charted_session(alice, notebook_image)
    log_in(page, portal_server, "alice")
    page.goto(f"{portal_server}/sessions/{session.pk}/")
    expect(page.get_by_role("heading", level=1)).to_contain_text("charts")
    charts = page.locator("[data-live-session]")
    expect(charts).to_have_attribute("data-state", "live", timeout=5000)
    page.wait_for_function("() => Number(document.querySelector('[data-live-session]').dataset.points || 0) >= 1")
    seen = int(charts.get_attribute("data-points") or 0)
    # The agent ticks every 250 ms here: within 3 seconds the chart must have taken new points.
    page.wait_for_function(
        "n => Number(document.querySelector('[data-live-session]').dataset.points) >= n + 2", arg=seen, timeout=3000
    )
    expect(page.locator("output[data-figure='util']")).to_have_text("0 %")  # nothing runs on it: an idle GPU
    expect(page.locator("output[data-figure='temp']")).to_contain_text("°C")
    expect(page.locator("[data-live-session] canvas")).to_have_count(4)  # utilisation, memory, temperature, power
    expect(page.get_by_text("No history yet")).to_be_visible()


def test_staff_watch_every_gpu_and_mig_device_with_who_uses_it(
    portal_server: str, page: Page, alice: User, staff: User, notebook_image: NotebookImage, agent: None
) -> None:
    charted_session(alice, notebook_image)
    allocate(alice, SliceRequest("mig", "1g.18gb", host="live"), holder=Holder.render(4))
    log_in(page, portal_server, "charlie")
    page.goto(f"{portal_server}/sessions/fleet/live/")
    tiles = page.locator("#fleet-tiles .gpu-tile")
    expect(tiles).to_have_count(3)
    expect(page.locator("[data-fleet-status]")).to_have_text("live")
    expect(page.locator(".mig-devices li")).to_have_count(2, timeout=5000)
    expect(page.locator(".mig-devices")).to_contain_text("2g.35gb")
    expect(page.locator(".mig-devices")).to_contain_text("alice #")
    # The render job's device names the job, from the slice's typed holder, and links to its page.
    job_link = page.locator(".mig-devices").get_by_role("link", name="Render job #4")
    expect(job_link).to_have_attribute("href", "/sessions/render-jobs/4/")
    expect(tiles.first).to_contain_text("simulated")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "fleet-live.png"), full_page=True)


def test_a_gpu_whose_agent_went_quiet_is_greyed_and_says_since_when(
    portal_server: str, page: Page, staff: User, notebook_image: NotebookImage, settings
) -> None:  # type: ignore[no-untyped-def]
    """Its agent stops: within seconds each tile says its figures are old, never showing them as live; a page
    opened afterwards gets the last frame marked stale at once."""
    use_fleet(settings, FLEET)
    process = processes.start_gpu_agent(FLEET, ARTIFACTS / "logs" / "gpu-agent-quiet-e2e.log")
    try:
        log_in(page, portal_server, "charlie")
        page.goto(f"{portal_server}/sessions/fleet/live/")
        tiles = page.locator("#fleet-tiles .gpu-tile")
        expect(tiles).to_have_count(3)
        expect(page.locator("#fleet-tiles .gpu-tile.stale")).to_have_count(0)
    finally:
        processes.stop(process)
    expect(page.locator("#fleet-tiles .gpu-tile.stale")).to_have_count(3, timeout=15000)
    expect(tiles.first.locator(".stale-note")).to_contain_text("its agent is quiet")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "fleet-live-stale.png"), full_page=True)
    page.reload()
    expect(page.locator("#fleet-tiles .gpu-tile.stale")).to_have_count(3, timeout=5000)


def test_a_chart_holds_a_fixed_number_of_points_however_long_it_runs(
    portal_server: str, page: Page, alice: User, notebook_image: NotebookImage, agent: None
) -> None:
    """Memory stays flat on a page left open: each series is a ring (900 points; 12 here, to see it wrap)."""
    session = charted_session(alice, notebook_image)
    page.add_init_script("window.PORTAL_CHART_POINTS = 12;")
    log_in(page, portal_server, "alice")
    page.goto(f"{portal_server}/sessions/{session.pk}/")
    page.wait_for_function(
        "() => Number(document.querySelector('[data-live-session]').dataset.points || 0) >= 20", timeout=15000
    )
    expect(page.locator("[data-live-session]")).to_have_attribute("data-held", "12")


def test_charts_reconnect_by_themselves_after_the_server_restarts(
    page: Page, alice: User, notebook_image: NotebookImage, agent: None
) -> None:
    port = processes.free_port()
    log = ARTIFACTS / "logs" / "daphne-restart.log"
    server = processes.start_daphne(port, log)
    base = f"http://127.0.0.1:{port}"
    try:
        session = charted_session(alice, notebook_image)
        log_in(page, base, "alice")
        page.goto(f"{base}/sessions/{session.pk}/")
        charts = page.locator("[data-live-session]")
        expect(charts).to_have_attribute("data-state", "live", timeout=5000)
        processes.stop(server)
        expect(charts).to_have_attribute("data-state", "reconnecting", timeout=5000)
        seen = int(charts.get_attribute("data-points") or 0)
        server = processes.start_daphne(port, log)
        # Back-off doubles from 1 s: within 10 s the page is live again and takes new points, no reload.
        expect(charts).to_have_attribute("data-state", "live", timeout=10000)
        page.wait_for_function(
            "n => Number(document.querySelector('[data-live-session]').dataset.points) >= n + 2", arg=seen
        )
    finally:
        processes.stop(server)


def test_bob_cannot_open_alices_session_page(
    portal_server: str, page: Page, alice: User, bob: User, notebook_image: NotebookImage
) -> None:
    private = running_session(alice, notebook_image, SliceRequest("mig", "1g.18gb"), "private")
    log_in(page, portal_server, "bob")
    response = page.goto(f"{portal_server}/sessions/{private.pk}/")
    assert response is not None and response.status == 404
