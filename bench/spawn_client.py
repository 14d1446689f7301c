"""Child of the spawn benchmark: launch sessions through the portal's service layer, as the form does.

python -m bench.spawn_client RUNS PUBLIC_URL [BURST]  (Django settings from the environment)
prints one JSON line: seconds from the launch call to JupyterLab's /api answering 200 through the proxy;
with BURST, BURST people launch at once (users bench0..), and the line lists each one's time.
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.error
import urllib.request

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
django.setup()

from django.contrib.auth.models import User  # noqa: E402

from sessions.gpus.allocator import SliceRequest  # noqa: E402
from sessions.notebooks.models import NotebookImage, NotebookSession  # noqa: E402
from sessions.notebooks.services import Launch, start_session, stop_session  # noqa: E402


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None  # a redirect (to the hub's pages, a login) means "not there yet"


OPENER = urllib.request.build_opener(_NoRedirects)


def answers(url: str) -> bool:
    """JupyterLab's /api answers 200 with its version, without following anything elsewhere."""
    try:
        with OPENER.open(url, timeout=2) as response:
            return bool(response.status == 200 and b"version" in response.read())
    except (urllib.error.URLError, OSError):
        return False


# In a burst, clients check less often: through the proxy an unrouted path reaches the portal (or the
# stock hub), and eight clients checking every 20 ms would be the heaviest load on the machine.
BURST_POLL_S = 0.2


def wait(check, timeout: float = 120, every: float = 0.02, what: str = "the check") -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(every)
    raise TimeoutError(f"waited {timeout} s for {what}")


def burst(count: int, public: str) -> list[float]:
    """``count`` people press Launch at the same moment; each one's request-to-ready time."""
    from concurrent.futures import ThreadPoolExecutor

    from django.db import connection

    image = NotebookImage.objects.get(default=True)
    users = [User.objects.get_or_create(username=f"bench{n}")[0] for n in range(count)]
    gate = time.monotonic() + 1.0

    def one(user: User) -> tuple[float, int]:
        try:
            time.sleep(max(0.0, gate - time.monotonic()))
            started = time.perf_counter()
            session = start_session(user, Launch(SliceRequest("mig", "1g.18gb"), image.pk, "burst"))
            url = f"{public}/jupyter/user/{user.username}/burst/api"
            wait(lambda: answers(url), every=BURST_POLL_S, what=f"{user.username}'s JupyterLab at {url}")
            return time.perf_counter() - started, session.pk
        finally:
            connection.close()

    with ThreadPoolExecutor(count) as pool:
        outcomes = list(pool.map(one, users))
    for user, (_, session_id) in zip(users, outcomes, strict=True):
        stop_session(session_id, by=user)
    for _, session_id in outcomes:
        wait(
            lambda session_id=session_id: NotebookSession.objects.get(pk=session_id).state == "stopped",
            90,
            what=f"session {session_id} to stop",
        )
    return [elapsed for elapsed, _ in outcomes]


def main(runs: int, public: str) -> None:
    user = User.objects.get(username="bench")
    image = NotebookImage.objects.get(default=True)
    times = []
    for number in range(runs):
        name = f"b{number}"
        started = time.perf_counter()
        session = start_session(user, Launch(SliceRequest("mig", "1g.18gb"), image.pk, name))
        wait(lambda name=name: answers(f"{public}/jupyter/user/bench/{name}/api"), what=f"JupyterLab of bench/{name}")
        times.append(time.perf_counter() - started)
        stop_session(session.pk, by=user)
        wait(
            lambda session=session: NotebookSession.objects.get(pk=session.pk).state == "stopped",
            60,
            what=f"session {session.pk} to stop",
        )
    print(json.dumps(times))


if __name__ == "__main__":
    if len(sys.argv) > 3:
        print(json.dumps(burst(int(sys.argv[3]), sys.argv[2])))
    else:
        main(int(sys.argv[1]), sys.argv[2])
