"""Every page of ours runs in Chromium under the Content-Security-Policy without a violation or a console error.

Each role walks its own pages: the header must be there, script-src must not
allow inline script, and no page may trip the policy (htmx's indicator styles,
an inline style="" attribute, eval) or log an error.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from django.contrib.auth.models import User
from django.utils import timezone
from playwright.sync_api import Page, expect

from portal.models import WorkerHeartbeat
from portal.roles import OPERATORS, USERS
from sessions.gpus.allocator import SliceRequest
from sessions.notebooks.models import NotebookImage, NotebookSession
from tests.conftest import ARTIFACTS
from tests.e2e.conftest import SCREENSHOTS, log_in
from tests.factories import make_user, running_session
from tests.gpus.conftest import use_fleet
from tests.helpers import processes
from tests.helpers.page_watch import PageWatch

pytestmark = pytest.mark.django_db(transaction=True)
FLEET = "csp: 1xH200:mig, 1xL4:whole"


@dataclass(frozen=True)
class Visit:
    name: str
    path: str
    ready: str  # a selector that is visible once the page has done its work (scripts, sockets, charts)
    clicks: tuple[str, ...] = ()  # then these, for what scripts do on a click (the admin's widgets)


@pytest.fixture
def agent(settings, notebook_image: NotebookImage) -> Iterator[None]:  # type: ignore[no-untyped-def]
    use_fleet(settings, FLEET)
    process = processes.start_gpu_agent(FLEET, ARTIFACTS / "logs" / "gpu-agent-csp.log")
    yield
    processes.stop(process)


@pytest.fixture
def a_running_session(alice: User, notebook_image: NotebookImage, agent: None) -> NotebookSession:
    return running_session(alice, notebook_image, SliceRequest("mig", "2g.35gb", host="csp"), "lab")


def visits_for(role: str, session: NotebookSession) -> list[Visit]:
    mig_gpu = session.slice.gpu_id if session.slice else 0
    return {
        "anonymous": [
            Visit("login", "/accounts/login/", "form"),
            Visit("password-reset", "/accounts/password_reset/", "form"),
        ],
        "alice": [
            Visit("dashboard", "/", "#card-sessions"),
            Visit("sessions", "/sessions/", f"#card-chart-{session.pk} canvas"),
            Visit("session-detail", f"/sessions/{session.pk}/", "[data-live-session][data-state='live'] canvas"),
            Visit("render-jobs", "/sessions/render-jobs/", "h1"),
            Visit("billing", "/billing/", "h1"),
            Visit("password-change", "/accounts/password_change/", "form"),
        ],
        "dora": [Visit("finance", "/billing/finance/", "h1")],
        "charlie": [
            Visit("staff-dashboard", "/", "#workers table"),
            Visit("fleet", "/sessions/fleet/", ".fleet-host"),
            Visit("fleet-gpu", f"/sessions/fleet/gpus/{mig_gpu}/", ".mig-map .mig-block.used"),
            Visit("fleet-live", "/sessions/fleet/live/", "#fleet-tiles .mig-devices li"),
            Visit("all-sessions", "/sessions/all/", "#all-sessions [data-testid='utilisation'] meter"),
            Visit("admin-sessions-operator", "/admin/notebooks/notebooksession/", "#result_list"),
        ],
        "root": [
            Visit("admin-index", "/admin/", "#content-main"),
            Visit("admin-change-list", "/admin/auth/user/", "#result_list"),
            Visit(
                "admin-change-form",
                f"/admin/auth/user/{session.owner_id}/change/",
                "#id_groups_to",
                clicks=("#id_groups_add_all", "#calendarlink0", "#calendarbox0 .calendar-shortcuts a"),
            ),
            Visit("admin-gpu-list", "/admin/gpus/gpu/", "#result_list"),
            Visit("admin-session", f"/admin/notebooks/notebooksession/{session.pk}/change/", "#id_idle_exempt"),
            Visit("admin-image-list", "/admin/notebooks/notebookimage/", "#result_list"),
        ],
    }[role]


@pytest.mark.parametrize("role", ["anonymous", "alice", "dora", "charlie", "root"])
def test_every_page_runs_under_the_policy_without_a_violation(
    portal_server: str,
    page: Page,
    role: str,
    a_running_session: NotebookSession,
    staff: User,
    billing_user: User,
) -> None:
    make_user("root", [USERS, OPERATORS], is_staff=True, is_superuser=True)  # the first administrator's kind
    WorkerHeartbeat.objects.create(name="celery@csp", seen_at=timezone.now())
    watch = PageWatch.on(page)
    if role != "anonymous":
        log_in(page, portal_server, role)
    for visit in visits_for(role, a_running_session):
        response = page.goto(portal_server + visit.path)
        assert response is not None and response.status == 200, visit.path
        policy = response.headers.get("content-security-policy", "")
        script_src = next((part for part in policy.split(";") if part.strip().startswith("script-src")), "")
        assert script_src.split() == ["script-src", "'self'"], f"{visit.path}: {policy!r}"
        expect(page.locator(visit.ready).first).to_be_visible(timeout=10000)
        for target in visit.clicks:
            page.locator(target).first.click()
        page.wait_for_timeout(300)  # a tick of live frames and htmx's settle, which is when a violation would come
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / f"csp-{visit.name}.png"), full_page=True)
        watch.assert_clean(visit.path)
