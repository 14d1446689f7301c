"""An operator walks the fleet pages in headless Chromium: overview, a GPU's layout, another GPU's slice picture."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from django.contrib.auth.models import User
from django.utils import timezone
from playwright.sync_api import Page, expect

from sessions.gpus.allocator import SliceRequest, allocate
from sessions.gpus.backends import get_backend
from sessions.gpus.holders import Holder
from sessions.gpus.models import Gpu, GpuHost
from tests.e2e.conftest import log_in
from tests.gpus.conftest import use_fleet

pytestmark = pytest.mark.django_db(transaction=True)
SCREENSHOT = "artifacts/screenshots/fleet-gpu.png"


@pytest.fixture
def sim_fleet(settings) -> Iterator[list[Gpu]]:  # type: ignore[no-untyped-def]
    # The daphne process runs the default simulated fleet, whose H200s are these two (same host and index),
    # so it can create their MIG instances when the operator applies a layout.
    settings.MAX_SLICES_PER_USER = 10
    yield use_fleet(settings, "sim-1: 2xH200:mig, 1xA30:shared=4")
    get_backend.cache_clear()


def test_an_operator_applies_a_layout_and_sees_who_holds_which_slice(
    portal_server: str, page: Page, staff: User, alice: User, sim_fleet: list[Gpu]
) -> None:
    allocate(alice, SliceRequest(kind="mig", profile="3g.71gb"), holder=Holder.notebook(12))
    allocate(alice, SliceRequest(kind="mig", profile="1g.18gb"), holder=Holder.render(3))

    log_in(page, portal_server, "charlie")
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Fleet", exact=True).click()
    expect(page.get_by_role("heading", level=1)).to_have_text("Fleet")
    expect(page.locator(".badge.sim")).to_have_count(4)  # the host and its three GPUs
    expect(page.get_by_text("no memory isolation between shares")).to_be_visible()
    page.screenshot(path="artifacts/screenshots/fleet.png", full_page=True)

    page.get_by_role("link", name="GPU 1", exact=True).click()
    expect(page.get_by_role("heading", level=1)).to_have_text("GPU 1 on sim-1")
    page.get_by_label("MIG policy", exact=True).select_option("static")
    page.get_by_role("button", name="Switch policy").click()
    expect(page.get_by_role("status").filter(has_text="now static")).to_be_visible()

    page.get_by_label("Or a custom layout", exact=True).fill("3g.71gb@0, 2g.35gb@2")
    page.get_by_role("button", name="Apply layout").click()
    expect(page.get_by_role("form", name="Apply a static layout").get_by_role("alert")).to_contain_text(
        "some are taken"
    )

    page.get_by_label("Or a custom layout", exact=True).fill("")
    page.get_by_label("Preset layout", exact=True).select_option("all-balanced")
    page.get_by_role("button", name="Apply layout").click()
    expect(page.get_by_role("status").filter(has_text="Layout applied")).to_be_visible()
    expect(page.locator(".mig-block.idle")).to_have_count(4)
    page.screenshot(path="artifacts/screenshots/fleet-gpu-layout.png", full_page=True)

    page.get_by_role("navigation", name="Breadcrumb").get_by_role("link", name="Fleet").click()
    page.get_by_role("link", name="GPU 0", exact=True).click()
    expect(page).to_have_url(re.compile(r"/sessions/fleet/gpus/\d+/$"))
    picture = page.locator(".mig-map")
    expect(picture.locator(".mig-block.used")).to_have_count(2)
    expect(picture.locator(".mig-block.used").filter(has_text="3g.71gb")).to_contain_text("alice")
    expect(picture.locator(".mig-block.used").filter(has_text="1g.18gb")).to_contain_text("Render job #3")
    slices = page.get_by_role("region", name="Active slices")
    expect(slices.get_by_role("link", name="Render job #3")).to_have_attribute("href", "/sessions/render-jobs/3/")
    expect(slices.get_by_role("link", name="Notebook session #12")).to_have_attribute("href", "/sessions/12/")
    expect(page.get_by_text("Compute slices used: 4 of 7")).to_be_visible()
    page.screenshot(path=SCREENSHOT, full_page=True)


def test_an_operator_drains_a_host_and_brings_it_back(
    portal_server: str, page: Page, staff: User, alice: User, sim_fleet: list[Gpu]
) -> None:
    log_in(page, portal_server, "charlie")
    page.goto(f"{portal_server}/sessions/fleet/")
    host = page.get_by_role("region", name="sim-1")
    expect(host.locator("[data-host-state]")).to_have_text("Up")
    host.get_by_role("button", name="Drain").click()
    expect(page.get_by_role("status").filter(has_text="sim-1 is draining")).to_be_visible()
    expect(host.locator("[data-host-state]")).to_have_text("Draining")
    expect(host).to_contain_text("Drained by charlie at")
    page.screenshot(path="artifacts/screenshots/fleet-draining.png", full_page=True)
    host.get_by_role("button", name="Take new work again").click()
    expect(host.locator("[data-host-state]")).to_have_text("Up")
    expect(host.get_by_role("button", name="Drain")).to_be_visible()


def test_an_operator_sees_each_hosts_swarm_node_beside_its_heartbeat(
    portal_server: str,
    page: Page,
    staff: User,
    settings,  # type: ignore[no-untyped-def]
) -> None:
    use_fleet(settings, "sim-1: 1xH200:mig; sim-2: 1xL4:whole; sim-3: 1xL4:whole")
    # As the Swarm watch records them (sessions/runtime/swarm.py, tried on the lab in tests/lab/test_lab.py).
    seen = timezone.now()
    GpuHost.objects.filter(name="sim-1").update(
        swarm_node="p4x2kqa7d9m1", swarm_state="ready", swarm_availability="active", swarm_seen_at=seen
    )
    GpuHost.objects.filter(name="sim-2").update(
        swarm_node="z8c3hw0e5b6n", swarm_state="down", swarm_availability="active", swarm_seen_at=seen
    )
    GpuHost.objects.filter(name="sim-3").update(swarm_seen_at=seen)  # no node has its name
    log_in(page, portal_server, "charlie")
    page.goto(f"{portal_server}/sessions/fleet/")
    expect(page.get_by_role("region", name="sim-1").locator("[data-swarm-state].good")).to_have_text("ready, active")
    expect(page.get_by_role("region", name="sim-2").locator("[data-swarm-state].bad")).to_have_text("down, active")
    expect(page.get_by_role("region", name="sim-3")).to_contain_text("not in the Swarm")
    page.screenshot(path="artifacts/screenshots/fleet-swarm.png", full_page=True)
    get_backend.cache_clear()
