"""Per person: uploads begun in a window (past it 429 with Retry-After and words, whichever session they come
from) and render jobs not yet ended (uploads on their way count); a refusal leaves nothing on disk."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.test import Client

from sessions.render.models import RenderJob, RenderUpload
from tests.render import scenes
from tests.render.conftest import begin_upload, stored
from tests.render.leftovers import traces
from tests.render.test_jobs import a_job

pytestmark = pytest.mark.django_db


def test_uploads_past_the_rate_are_answered_429_with_retry_after_whichever_session_sends_them(
    alice: User, alice_client: Client, render_dir: Path, settings
) -> None:  # type: ignore[no-untyped-def]
    settings.RENDER_UPLOADS_PER_WINDOW = 3
    other_session = Client()
    other_session.force_login(alice)
    for client in (alice_client, other_session, alice_client):
        assert begin_upload(client, "a.blend", 10).status_code == 201
    before = traces(render_dir)
    refused = begin_upload(other_session, "a.blend", 10)
    assert refused.status_code == 429
    assert 1 <= int(refused["Retry-After"]) <= 601
    words = refused.content.decode()
    assert words.startswith("You began 3 uploads in the last 10 minutes, the most a person may; try again in ")
    assert traces(render_dir) == before  # nothing of the refused one on disk or in the database


def test_one_more_upload_than_open_jobs_allow_is_refused_in_words(
    alice: User, alice_client: Client, bob_client: Client, render_dir: Path, settings
) -> None:  # type: ignore[no-untyped-def]
    settings.RENDER_MAX_OPEN_JOBS = 3
    a_job(alice, RenderJob.State.RENDERING)
    a_job(alice, RenderJob.State.DONE)  # ended: not counted
    assert begin_upload(alice_client, "a.blend", len(scenes.blend())).status_code == 201
    assert begin_upload(alice_client, "b.zip", 100).status_code == 201
    refused = begin_upload(alice_client, "c.blend", 100)
    assert refused.status_code == 409
    assert refused.content.decode().strip() == (
        "You have 3 render jobs that have not ended (uploads on their way count), the most a person may have: "
        "cancel one, or wait for one to end."
    )
    assert RenderUpload.objects.count() == 2 and len([path for path in stored(render_dir) if path.count("/") == 1]) == 2
    assert begin_upload(bob_client, "d.blend", 100).status_code == 201  # each person counts their own
