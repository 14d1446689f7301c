"""Child of the spawn benchmark: launch sessions through the portal's service layer, as the form does.

python -m bench.spawn_client RUNS PUBLIC_URL  (Django settings from the environment)
prints one JSON line: seconds from the launch call to JupyterLab's /api answering 200 through the proxy.
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


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200 and b"version" in response.read())
    except (urllib.error.URLError, OSError):
        return False


def wait(check, timeout: float = 120) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.02)
    raise TimeoutError("timed out")


def main(runs: int, public: str) -> None:
    user = User.objects.get(username="bench")
    image = NotebookImage.objects.get(default=True)
    times = []
    for number in range(runs):
        name = f"b{number}"
        started = time.perf_counter()
        session = start_session(user, Launch(SliceRequest("mig", "1g.18gb"), image.pk, name))
        wait(lambda name=name: answers(f"{public}/jupyter/user/bench/{name}/api"))
        times.append(time.perf_counter() - started)
        stop_session(session.pk, by=user)
        wait(lambda session=session: NotebookSession.objects.get(pk=session.pk).state == "stopped", 60)
    print(json.dumps(times))


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2])
