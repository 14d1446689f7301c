"""Waiting for something another process does, with a deadline and a message that says what."""

from __future__ import annotations

import time
from collections.abc import Callable

from sessions.notebooks.models import NotebookSession


def wait_for(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def state_of(session: NotebookSession) -> str:
    session.refresh_from_db()
    return session.state
