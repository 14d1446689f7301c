"""The smoke test of the containers deployment (issue 33): the images built offline, the portal brought up on a
one-node Swarm with `docker stack deploy` and then with Debian's docker-compose, and each used as a person
would, through the public entry in Chromium: log in, add credit, launch a notebook session on a simulated
GPU, open its JupyterLab, stop it, find its minutes charged to its true end, upload a small scene, confirm its
estimate, see it rendered and fetch a frame. A backup of the Swarm stack is restored into the Compose one
(the ledger and invoices the same), and each is torn down leaving no container, network, volume or rule."""

from __future__ import annotations

import json
import os
import re
import signal
import tempfile
import time
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Locator, Page, expect

from tests.conftest import ROOT
from tests.deploy.deployment import DOCKER, Deployment, build_images, deployed, run
from tests.render.stack import SMALL_SCENE, blender_in_image

pytestmark = [pytest.mark.docker, pytest.mark.deploy, pytest.mark.timeout(2400)]
SCREENSHOTS = ROOT / "artifacts/screenshots"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
JPEG_MAGIC = b"\xff\xd8\xff"

# What the portal's books say about the sessions' holdings: each ended holding's true length, the minutes the
# meter charged for it (rows and folded days), whether its usage is closed; and the ledger's sum and
# unbalanced transactions.
CHARGES = """
import json
from django.db.models import Sum
from billing.models import ChargedMinute, Entry, Usage, UsageDay
from sessions.notebooks.models import NotebookSession
holdings = []
for session in NotebookSession.objects.select_related("slice").order_by("pk"):
    held = session.slice
    usage = Usage.objects.filter(slice=held).first() if held else None
    end = held.held_until or held.released_at if held else None
    rows = ChargedMinute.objects.filter(usage=usage).count() if usage else 0
    days = UsageDay.objects.filter(usage=usage).aggregate(m=Sum("minutes"))["m"] or 0 if usage else 0
    holdings.append({
        "name": session.server_name, "state": session.state,
        "seconds": (end - held.held_from).total_seconds() if end and held.held_from else None,
        "billed": usage.billed_minutes if usage else None, "charged": rows + days,
        "open": usage.open if usage else None,
    })
sums = Entry.objects.values("transaction_id").annotate(total=Sum("amount")).exclude(total=0)
total = Entry.objects.aggregate(total=Sum("amount"))["total"] or 0
print(json.dumps({"holdings": holdings, "ledger_total": str(total), "unbalanced": len(sums)}))
"""

# The books as a restore must give them back: every ledger transaction with its entries, every usage and its
# charged minutes, every invoice with its lines.
BOOKS = """
import json
from billing.models import ChargedMinute, Entry, Invoice, InvoiceLine, LedgerTransaction, Usage, UsageDay
rows = lambda model: [list(map(str, row)) for row in model.objects.order_by("pk").values_list()]
books = {model.__name__: rows(model) for model in
         (LedgerTransaction, Entry, Usage, ChargedMinute, UsageDay, Invoice, InvoiceLine)}
print(json.dumps(books))
"""


@pytest.fixture(scope="module")
def images() -> None:
    build_images()


@pytest.fixture(scope="module")
def scene() -> Path:
    folder = Path(tempfile.mkdtemp(prefix="gpu-portal-deploy-scene-", dir="/var/tmp"))
    blender_in_image(folder, SMALL_SCENE)
    return folder / "small.blend"


def shot(page: Page, mode: str, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"deploy-{mode}-{name}.png"), full_page=True)


def log_in(page: Page, deployment: Deployment) -> None:
    username, password = deployment.admin
    page.goto(deployment.base_url + "/accounts/login/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_role("heading", level=1)).to_have_text("Dashboard")


def add_credit(page: Page, deployment: Deployment) -> None:
    page.goto(deployment.base_url + "/billing/credit/")
    page.get_by_label("Person").fill(deployment.admin[0])
    page.get_by_label("Amount").fill("50")
    page.get_by_label("Reason").fill("smoke test")
    page.get_by_role("button", name="Add credit").click()
    expect(page.get_by_role("status")).to_contain_text(f"Added 50.00 CNY to {deployment.admin[0]}")


def first_mig_offer(page: Page) -> str:
    values = (
        page.get_by_label("GPU slice")
        .locator("option")
        .evaluate_all("(options) => options.filter((o) => !o.disabled).map((o) => o.value)")
    )
    return str(next(value for value in values if value.startswith("mig:")))


def start_a_notebook(page: Page, deployment: Deployment, name: str) -> None:
    page.goto(deployment.base_url + "/sessions/")
    page.get_by_label("GPU slice").select_option(first_mig_offer(page))
    page.get_by_label("Session name").fill(name)
    page.get_by_role("button", name="Start JupyterLab").click()
    expect(card_of(page, name).get_by_text("Running", exact=True)).to_be_visible(timeout=180_000)


def card_of(page: Page, name: str) -> Locator:
    return page.locator("article.session-card", has_text=name)


def open_jupyterlab(page: Page, deployment: Deployment, name: str) -> None:
    with page.context.expect_page() as opened:
        card_of(page, name).get_by_role("link", name="Open JupyterLab").click()
    lab = opened.value
    expect(lab).to_have_url(re.compile(rf"/jupyter/user/[^/]+/{name}/lab"), timeout=60_000)
    expect(lab).to_have_title(re.compile("JupyterLab"), timeout=60_000)
    expect(lab.locator("#jp-main-dock-panel")).to_be_visible(timeout=60_000)  # the lab itself, drawn
    expect(lab.locator("#jupyterlab-splash")).to_have_count(0, timeout=60_000)
    shot(lab, deployment.mode, f"jupyterlab-{name}")
    lab.close()
    page.bring_to_front()


def stop_a_notebook(page: Page, deployment: Deployment, name: str) -> None:
    card = card_of(page, name)
    card.get_by_role("button", name="Stop").click()
    expect(card.get_by_text("Stopped", exact=True)).to_be_visible(timeout=120_000)
    shot(page, deployment.mode, f"stopped-{name}")


def use_a_notebook(page: Page, deployment: Deployment) -> None:
    name = f"smoke-{deployment.mode}"
    start_a_notebook(page, deployment, name)
    open_jupyterlab(page, deployment, name)
    page.wait_for_timeout(2000)
    stop_a_notebook(page, deployment, name)


def charged_to_the_end(deployment: Deployment) -> Any:
    """The books once the meter (beat's tick, every minute) has settled the stopped session."""
    books: Any = {}
    for _ in range(60):
        books = deployment.python(CHARGES)
        holdings = books["holdings"]
        if holdings and all(holding["open"] is False for holding in holdings):
            return books
        time.sleep(5)
    raise AssertionError(f"the stopped session's usage was not closed within 5 minutes: {books}")


def render_a_frame(page: Page, deployment: Deployment, scene: Path) -> None:
    page.goto(deployment.base_url + "/sessions/render-jobs/")
    page.get_by_label("Frames", exact=True).fill("1-2")
    page.get_by_label("GPU slice").select_option(first_mig_offer(page))
    page.get_by_label("Frames per chunk").fill("2")
    page.get_by_label("Scene (.blend, or a .zip with its assets)").set_input_files(str(scene))
    page.get_by_role("button", name="Upload and check").click()
    expect(page.get_by_role("heading", level=1)).to_have_text("small.blend")
    expect(page.get_by_test_id("estimate")).to_be_visible(timeout=240_000)
    page.get_by_role("button", name="Confirm and render").click()
    gallery = page.get_by_test_id("gallery")
    expect(gallery).to_be_visible(timeout=300_000)
    expect(page.get_by_test_id("frames-done")).to_have_text("2 of 2 frames")
    shot(page, deployment.mode, "render-done")
    thumbnail = gallery.get_by_role("img").first.get_attribute("src")
    frame = gallery.get_by_role("link", name="Frame 1").first.get_attribute("href")
    assert thumbnail and frame, (thumbnail, frame)
    for path, magic in ((thumbnail, JPEG_MAGIC), (frame, PNG_MAGIC)):
        answer = page.request.get(deployment.base_url + path)
        assert answer.status == 200, (path, answer.status)
        assert answer.body().startswith(magic), path


def charged_exactly(deployment: Deployment, name: str) -> None:
    """The session's holding charged every minute begun before its true end, once; the ledger balanced."""
    books = charged_to_the_end(deployment)
    (holding,) = [held for held in books["holdings"] if held["name"] == name]
    assert holding["state"] == "stopped", holding
    due = max(1, -(-int(holding["seconds"] * 1000) // 60_000))
    assert holding["billed"] == holding["charged"] == due, holding
    assert Decimal(books["ledger_total"]) == 0, books
    assert books["unbalanced"] == 0, books


def use_it(page: Page, deployment: Deployment, scene: Path) -> None:
    log_in(page, deployment)
    add_credit(page, deployment)
    use_a_notebook(page, deployment)
    charged_exactly(deployment, f"smoke-{deployment.mode}")
    render_a_frame(page, deployment, scene)


KILLED = ["web", "worker", "beat", "hub", "proxy", "agent", "render", "redis", "postgres"]
CRASHED = ["web", "worker", "postgres"]


def docker_kill(deployment: Deployment, service: str) -> None:
    """`docker kill`: SIGKILL to the container. Swarm starts a new task; Docker itself counts it as stopped by
    hand and leaves it down, whatever the restart policy (a Compose stack's programs die as below)."""
    (container,) = deployment.containers(service)
    run(DOCKER, "kill", container)


def crash(deployment: Deployment, service: str) -> None:
    """The program dies as a crash or the kernel's OOM killer ends it: SIGKILL from this machine to the
    container's program, the child of its init (tini), which then exits; the restart policy starts it again."""
    (container,) = deployment.containers(service)
    init = int(run(DOCKER, "inspect", "--format", "{{.State.Pid}}", container))
    children = Path(f"/proc/{init}/task/{init}/children").read_text().split()
    assert children, f"{service}'s init has no program"
    for child in children:
        os.kill(int(child), signal.SIGKILL)


def survives(
    page: Page, deployment: Deployment, services: list[str], end: Callable[[Deployment, str], None]
) -> dict[str, float]:
    """Each service's program ended once (``end``) while a session runs: each comes back healthy, the session
    still runs and opens, and once stopped it is charged every minute once. Returns how long each took."""
    name = f"through-{end.__name__.replace('_', '-')}"
    start_a_notebook(page, deployment, name)
    back_within = {}
    for service in services:
        started, before = time.monotonic(), deployment.lives(service)
        end(deployment, service)
        deployment.restarted(service, before)
        deployment.wait_healthy(timeout=240)
        back_within[service] = round(time.monotonic() - started, 1)
    page.goto(deployment.base_url + "/sessions/")
    expect(card_of(page, name).get_by_text("Running", exact=True)).to_be_visible(timeout=60_000)
    open_jupyterlab(page, deployment, name)
    stop_a_notebook(page, deployment, name)
    charged_exactly(deployment, name)
    return back_within


def test_the_portal_deployed_on_a_swarm_then_with_compose_is_used_backed_up_restored_and_leaves_nothing(
    images: None, scene: Path, page: Page
) -> None:
    dump = Path(tempfile.mkdtemp(prefix="gpu-portal-deploy-backup-", dir="/var/tmp")) / "portal.dump"
    with deployed("swarm") as swarm:
        use_it(page, swarm, scene)
        killed_back_within = survives(page, swarm, KILLED, docker_kill)
        running = swarm.running()
        swarm.deploy()  # a second deploy of the same file and settings changes nothing
        time.sleep(10)
        assert swarm.running() == running, "a second deploy replaced containers"
        run(str(ROOT / "compose/bin/backup"), swarm.name, str(dump))
        books = swarm.python(BOOKS)
    page.context.clear_cookies()
    with deployed("compose", secrets_of=swarm) as composed:
        run(str(ROOT / "compose/bin/restore"), composed.name, str(dump), timeout=600)
        composed.wait_healthy(timeout=300)
        assert composed.python(BOOKS) == books, "the restored books differ from the backed-up ones"
        running = composed.running()
        composed.compose("up", "-d", "--no-build")  # a second up changes nothing
        assert composed.running() == running, "a second up replaced containers"
        use_it(page, composed, scene)
        crashed_back_within = survives(page, composed, CRASHED, crash)
    entries = len(books["Entry"])
    print(
        json.dumps(
            {
                "backup_bytes": dump.stat().st_size,
                "ledger_entries": entries,
                "killed_back_within_s": killed_back_within,
                "crashed_back_within_s": crashed_back_within,
            }
        )
    )
    dump.unlink()
