"""The dashboard shell: navigation by role, error pages, htmx partials, bad requests."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from portal.models import WorkerHeartbeat
from tests.factories import PASSWORD

pytestmark = pytest.mark.django_db


def logged_in(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_a_user_sees_the_dashboard_and_the_user_navigation(alice: User) -> None:
    page = logged_in(alice).get("/").content.decode()
    assert "<h1>Dashboard</h1>" in page
    for label in ("Sessions", "Render jobs", "Billing"):
        assert f">{label}</a>" in page
    assert ">Fleet</a>" not in page
    assert ">Admin</a>" not in page
    assert ">Finance</a>" not in page


def test_staff_see_fleet_and_admin_in_the_navigation(staff: User) -> None:
    page = logged_in(staff).get("/").content.decode()
    assert ">Fleet</a>" in page
    assert ">Admin</a>" in page


def test_billing_staff_see_the_finance_view(billing_user: User) -> None:
    client = logged_in(billing_user)
    assert ">Finance</a>" in client.get("/").content.decode()
    assert client.get(reverse("billing-finance")).status_code == 200


def test_a_user_gets_403_on_the_fleet_and_finance_pages(alice: User) -> None:
    client = logged_in(alice)
    for name in ("fleet", "billing-finance"):
        response = client.get(reverse(name))
        assert response.status_code == 403
        assert "Not allowed" in response.content.decode()


def test_the_navigation_pages_answer_for_a_user(alice: User) -> None:
    client = logged_in(alice)
    for name in ("session-list", "render-job-list", "billing-account"):
        response = client.get(reverse(name))
        assert response.status_code == 200
        assert 'aria-current="page"' in response.content.decode()


def test_an_unknown_url_gets_the_portals_404_page(alice: User) -> None:
    response = logged_in(alice).get("/no/such/page/")
    assert response.status_code == 404
    assert "Page not found" in response.content.decode()


def test_a_forged_csrf_token_is_refused_and_changes_nothing(alice: User) -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(alice)
    new = "a brand new passphrase 42"
    response = client.post(
        reverse("password_change"),
        {"old_password": PASSWORD, "new_password1": new, "new_password2": new, "csrfmiddlewaretoken": "forged"},
    )
    assert response.status_code == 403
    assert "Form expired" in response.content.decode()
    alice.refresh_from_db()
    assert alice.check_password(PASSWORD)


def test_an_oversized_body_gets_400_and_changes_nothing(alice: User, settings) -> None:  # type: ignore[no-untyped-def]
    client = logged_in(alice)
    filler = "x" * (settings.DATA_UPLOAD_MAX_MEMORY_SIZE + 1)
    response = client.post(
        reverse("password_change"),
        {"old_password": PASSWORD, "new_password1": filler, "new_password2": filler},
    )
    assert response.status_code == 400
    assert "Bad request" in response.content.decode()
    alice.refresh_from_db()
    assert alice.check_password(PASSWORD)


def test_htmx_gets_only_the_workers_partial(staff: User) -> None:
    WorkerHeartbeat.objects.create(name="celery", seen_at=timezone.now())
    response = logged_in(staff).get("/", HTTP_HX_REQUEST="true", HTTP_HX_TARGET="workers")
    page = response.content.decode()
    assert page.lstrip().startswith('<div id="workers"')
    assert "celery" in page
    assert "<html" not in page


def test_a_quiet_worker_is_flagged_to_staff(staff: User) -> None:
    WorkerHeartbeat.objects.create(name="celery", seen_at=timezone.now() - timedelta(minutes=10))
    page = logged_in(staff).get("/").content.decode()
    assert "quiet" in page


def test_pages_carry_the_csrf_header_for_htmx(alice: User) -> None:
    page = logged_in(alice).get("/").content.decode()
    assert 'hx-headers=\'{"X-CSRFToken":' in page
    assert "django_htmx/htmx-2.min" in page


def test_the_health_check_is_public_and_plain(client: Client) -> None:
    response = client.get(reverse("healthz"))
    assert response.status_code == 200
    assert response.content == b"ok"


def test_security_headers_are_set(alice: User) -> None:
    response = logged_in(alice).get("/")
    assert response["X-Frame-Options"] == "DENY"
    assert response["X-Content-Type-Options"] == "nosniff"


def test_the_dashboard_stays_within_its_query_budget(alice: User, staff: User, django_assert_max_num_queries) -> None:  # type: ignore[no-untyped-def]
    # The session and its person, their sessions, the count of their queued and rendering jobs, two for the
    # finance permission (the navigation), and billing's card and notices: an open credit stop, this month's
    # budget alerts, running holdings and the balance. None of it grows with history.
    alice_client, staff_client = logged_in(alice), logged_in(staff)
    with django_assert_max_num_queries(10):
        alice_client.get("/")
    with django_assert_max_num_queries(11):
        staff_client.get("/")


def test_the_dashboard_counts_the_persons_own_queued_and_rendering_jobs_and_links_to_them(
    alice: User, bob: User
) -> None:
    from sessions.render.models import RenderJob

    State = RenderJob.State
    for owner, state in [
        (alice, State.QUEUED),
        (alice, State.RENDERING),
        (alice, State.RENDERING),
        (alice, State.AWAITING_CONFIRMATION),  # not confirmed: nothing of it renders
        (alice, State.DONE),
        (alice, State.FAILED),
        (bob, State.RENDERING),  # someone else's
    ]:
        RenderJob.objects.create(owner=owner, state=state, upload_name="s.blend", folder=f"t/{owner.pk}", frames=[1])

    page = logged_in(alice).get("/").content.decode()

    card = page[page.index('id="card-render-jobs"') :]
    card = card[: card.index("</article>")]
    jobs = reverse("render-job-list")
    assert f'<p class="figure"><a href="{jobs}#render-jobs" data-testid="render-jobs-running">3</a></p>' in card
    assert "queued or rendering" in card
    assert '<p class="figure"><a href="' in logged_in(bob).get("/").content.decode()
    assert 'data-testid="render-jobs-running">1</a>' in logged_in(bob).get("/").content.decode()


def test_a_notebook_path_the_proxy_has_no_route_for_goes_to_the_hub(client: Client) -> None:
    answer = client.get("/jupyter/user/alice/lab-1/lab/tree/work?reset=1")
    assert answer.status_code == 302
    assert answer["Location"] == "/jupyter/hub/user/alice/lab-1/lab/tree/work?reset=1"


def test_htmx_gets_only_the_session_notices_partial(alice: User) -> None:
    """What static/js/billing.js fetches when the socket says a notice was given (a spot reclaim, say)."""
    from sessions.notebooks.models import NotebookImage, NotebookSession

    image = NotebookImage.objects.create(name="lab", image="gpu-portal/notebook:latest", enabled=True)
    NotebookSession.objects.create(
        owner=alice, server_name="lab-1", image=image, state=NotebookSession.State.RUNNING, warning="Reclaimed soon"
    )
    page = logged_in(alice).get("/", HTTP_HX_REQUEST="true", HTTP_HX_TARGET="session-warnings").content.decode()
    assert page.lstrip().startswith('<div id="session-warnings"')
    assert "Reclaimed soon" in page
    assert "<html" not in page
