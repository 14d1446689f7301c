"""The spawner's reports to the portal (issue 30, money 3): a start the portal did not take is sent again
until it is, so a portal restarting for a moment never leaves a session unbilled; a refusal is final."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web

from sessions.notebooks.spawner import PortalSpawner
from tests.helpers.processes import free_port


@dataclass
class HubUser:
    """What a spawner reads of JupyterHub's user: its name (the rest is JupyterHub's business)."""

    name: str = "alice"
    url: str = "/jupyter/user/alice/"
    escaped_name: str = "alice"
    settings: dict[str, Any] = field(default_factory=dict)


@dataclass
class Portal:
    url: str
    answers: list[int]
    received: list[dict[str, Any]] = field(default_factory=list)


@pytest.fixture
async def portal() -> AsyncIterator[Portal]:
    """A stand-in for the portal's internal API on 127.0.0.1 that answers as it is told, one answer a call."""
    found = Portal("", [])

    async def events(request: web.Request) -> web.Response:
        found.received.append(json.loads(await request.read()))
        status = found.answers.pop(0) if found.answers else 200
        return web.json_response({"ok": status == 200}, status=status)

    app = web.Application()
    app.router.add_post("/internal/notebooks/events", events)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    found.url = f"http://127.0.0.1:{port}"
    yield found
    await runner.cleanup()


def spawner(url: str, patience: float) -> PortalSpawner:
    return PortalSpawner(user=HubUser(), portal_url=url, portal_token="token", report_patience=patience)


async def test_a_start_the_portal_did_not_take_is_sent_again_until_it_is_taken(portal: Portal) -> None:
    portal.answers = [503, 502, 200]
    await spawner(portal.url, 30)._report("container_started", 7, at="2026-12-05T10:00:00.5Z", container_id="c1")
    assert len(portal.received) == 3
    assert all(body == portal.received[0] for body in portal.received)
    assert portal.received[0] == {
        "session": 7,
        "user": "alice",
        "event": "container_started",
        "at": "2026-12-05T10:00:00.5Z",
        "container_id": "c1",
    }


async def test_a_report_the_portal_refuses_is_not_sent_again(portal: Portal) -> None:
    portal.answers = [404]
    await spawner(portal.url, 30)._report("ready", 7)
    assert len(portal.received) == 1


async def test_a_portal_that_never_answers_is_given_up_on_after_the_spawner_s_patience() -> None:
    began = time.monotonic()
    await spawner(f"http://127.0.0.1:{free_port()}", 2)._report("ready", 7)  # nothing listens there
    assert 1 <= time.monotonic() - began < 10
