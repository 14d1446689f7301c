"""The operators' page of everyone's sessions: who, on what, how long, how busy; and stop from there."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis
from django.conf import settings
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from sessions.gpus.allocator import SliceRequest
from sessions.metrics.agent import latest_key
from sessions.metrics.frames import dumps
from sessions.notebooks.models import NotebookImage, NotebookSession
from tests.factories import running_session
from tests.helpers.processes import free_port

pytestmark = pytest.mark.django_db
PAGE = reverse("session-all")
HTMX = {"HX-Request": "true", "HX-Target": "all-sessions"}


def as_user(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def sessions(settings, notebook_image: NotebookImage, alice: User, bob: User) -> dict[str, NotebookSession]:  # type: ignore[no-untyped-def]
    settings.MAX_SLICES_PER_USER = 10
    made = {
        "alice-mig": running_session(alice, notebook_image, SliceRequest("mig", "1g.18gb"), "alice-mig"),
        "bob-whole": running_session(bob, notebook_image, SliceRequest("whole"), "bob-whole"),
        "bob-ended": running_session(bob, notebook_image, SliceRequest("mig", "1g.18gb"), "bob-ended"),
    }
    NotebookSession.objects.filter(pk=made["bob-ended"].pk).update(state=NotebookSession.State.STOPPED)
    return made


@pytest.fixture
def store() -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(settings.REDIS_URL)
    client.delete(latest_key())
    yield client
    client.delete(latest_key())
    client.close()


def publish_latest(store: redis.Redis, agent: str, t: float, devices: dict[str, float | None]) -> None:
    """A fleet frame as the agent leaves it in the latest-frame store: one GPU holding every device as MIG."""
    gpu = {"uuid": f"GPU-{agent}", "util": None, "devices": [{"uuid": u, "util": v} for u, v in devices.items()]}
    store.hset(latest_key(), agent, dumps({"kind": "fleet", "agent": agent, "t": t, "gpus": [gpu]}))


def row(page: str, session: NotebookSession) -> str:
    return page.split(f'id="all-session-{session.pk}"', 1)[1].split("</tr>", 1)[0]


def test_the_page_lists_everyones_active_sessions_with_owner_slice_state_and_age(
    staff: User, sessions: dict[str, NotebookSession], store: redis.Redis
) -> None:
    page = as_user(staff).get(PAGE).content.decode()
    assert "bob-ended" not in page
    mig, whole = sessions["alice-mig"], sessions["bob-whole"]
    assert page.index(f"all-session-{mig.pk}") < page.index(f"all-session-{whole.pk}")  # oldest first
    first = row(page, mig)
    assert '<td data-testid="owner">alice</td>' in first
    assert mig.slice is not None and mig.slice.describe() in first and "simulated" in first
    assert '<span class="badge good" data-testid="state">Running</span>' in first
    assert "0\xa0minutes</time>" in first
    assert "Whole GPU on" in row(page, whole) and '<td data-testid="owner">bob</td>' in row(page, whole)
    assert 'aria-current="page"' in page and ">All sessions</a>" in page


def test_utilisation_comes_from_the_latest_live_frames(
    staff: User, sessions: dict[str, NotebookSession], store: redis.Redis
) -> None:
    mig, whole = sessions["alice-mig"].slice, sessions["bob-whole"].slice
    assert mig is not None and whole is not None
    publish_latest(store, "sim-1", time.time(), {mig.device_uuid: 62.4})
    publish_latest(store, "sim-2", time.time(), {whole.device_uuid: None})
    page = as_user(staff).get(PAGE).content.decode()
    assert '<meter min="0" max="100" low="30" high="70" optimum="100" value="62">' in row(page, sessions["alice-mig"])
    assert "does not report utilisation" in row(page, sessions["bob-whole"])  # reported as none: n/a, never 0
    publish_latest(store, "sim-1", time.time() - 60, {mig.device_uuid: 62.4})  # its agent went quiet
    assert "No live frame for this device" in row(as_user(staff).get(PAGE).content.decode(), sessions["alice-mig"])


def test_without_redis_the_page_still_lists_sessions_and_says_figures_are_unavailable(
    settings, staff: User, sessions: dict[str, NotebookSession]
) -> None:  # type: ignore[no-untyped-def]
    settings.REDIS_URL = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    page = as_user(staff).get(PAGE).content.decode()
    assert "Live GPU figures are unavailable right now" in page
    assert "alice-mig" in page and "bob-whole" in page


def test_only_operators_get_the_page(client: Client, alice: User) -> None:
    assert client.get(PAGE).status_code == 302  # to the login page
    refused = as_user(alice).get(PAGE)
    assert refused.status_code == 403 and "Not allowed" in refused.content.decode()
    assert ">All sessions</a>" not in as_user(alice).get(reverse("dashboard")).content.decode()


def test_an_operator_stops_someone_elses_session_from_the_page_with_htmx(
    staff: User, sessions: dict[str, NotebookSession], store: redis.Redis
) -> None:
    bobs = sessions["bob-whole"]
    answer = as_user(staff).post(reverse("session-stop", args=[bobs.pk]), {"back": "all"}, headers=HTMX)
    assert answer.status_code == 200
    page = answer.content.decode()
    assert page.lstrip().startswith('<section id="all-sessions"') and "<html" not in page
    assert '<span class="badge warn" data-testid="state">Stopping</span>' in row(page, bobs)
    assert f'action="/sessions/{bobs.pk}/stop/"' not in page  # nothing more to stop
    bobs.refresh_from_db()
    assert bobs.state == NotebookSession.State.STOPPING
    assert bobs.ended_reason == NotebookSession.EndReason.STAFF


def test_without_javascript_a_stop_from_the_page_comes_back_to_it(
    staff: User, sessions: dict[str, NotebookSession]
) -> None:
    answer = as_user(staff).post(reverse("session-stop", args=[sessions["alice-mig"].pk]), {"back": "all"})
    assert answer.status_code == 302 and answer["Location"] == PAGE


def test_the_poll_gets_only_the_table(staff: User, sessions: dict[str, NotebookSession], store: redis.Redis) -> None:
    page = as_user(staff).get(PAGE, headers=HTMX).content.decode()
    assert page.lstrip().startswith('<section id="all-sessions"') and 'hx-trigger="every 5s"' in page
    assert "<html" not in page and "alice-mig" in page


def test_the_page_stays_within_its_query_budget(
    settings, staff: User, notebook_image: NotebookImage, store: redis.Redis, django_assert_max_num_queries
) -> None:  # type: ignore[no-untyped-def]
    settings.MAX_SLICES_PER_USER = 10
    for n in range(5):
        running_session(staff, notebook_image, SliceRequest("mig", "1g.18gb"), f"lab-{n}")
    client = as_user(staff)
    # Login session, user, the sessions (with owner, slice, GPU, host and image), the navigation's permissions.
    with django_assert_max_num_queries(5):
        page = client.get(PAGE).content.decode()
    assert page.count('data-testid="owner"') == 5
