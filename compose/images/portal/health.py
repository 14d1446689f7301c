"""Health checks of the portal's containers (compose/compose.yaml): `entrypoint health <program>` exits 0 when the
program does its work, 1 with the reason otherwise. Each asks the program itself, not only whether it runs."""

from __future__ import annotations

import os
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the portal's code (/app), run from any folder


def answers(url: str) -> None:
    with urllib.request.urlopen(url, timeout=5) as response:  # noqa: S310  # our own address, http
        if response.status != 200:
            raise SystemExit(f"{url} answered {response.status}")


def worker(queue_variable: str, suffix: str, host: str) -> None:
    import django

    django.setup()
    from portal.celery import app

    queue = os.environ.get("PORTAL_CELERY_QUEUE", "portal")
    name = f"{os.environ.get(queue_variable) or queue + suffix}@{host}"
    if not app.control.ping(destination=[name], timeout=3):
        raise SystemExit(f"the Celery worker {name} does not answer")


def beat() -> None:
    # Beat writes its schedule as it sends (every few minutes at most, celery's beat_sync_every).
    # (Its shelve's file names get the dbm module's suffix: celerybeat-schedule.db here.)
    folder = Path(os.environ.get("PORTAL_DATA_DIR", "/var/lib/portal"))
    written = [path.stat().st_mtime for path in folder.glob("celerybeat-schedule*")]
    if not written or time.time() - max(written) > 600:
        raise SystemExit(f"beat has not written its schedule in {folder} for ten minutes")


def agent() -> None:
    import django

    django.setup()
    from datetime import timedelta

    from django.conf import settings

    from portal.clock import database_now
    from sessions.gpus import agency
    from sessions.gpus.models import GpuHost

    since = database_now() - timedelta(seconds=settings.HOST_LOST_AFTER_S)
    names = agency.hosts_of_this_machine()
    beaten = set(GpuHost.objects.filter(name__in=names, heartbeat_at__gte=since).values_list("name", flat=True))
    silent = sorted(set(names) - beaten)
    if silent:
        raise SystemExit(f"no recent heartbeat from {', '.join(silent)}")


def main(program: str) -> None:
    import socket

    host = os.environ.get("PORTAL_AGENT_HOST") or socket.gethostname()
    if program == "web":
        answers(f"http://127.0.0.1:{os.environ.get('PORTAL_INTERNAL_PORT', '8000')}/healthz")
    elif program == "worker":
        worker("PORTAL_CELERY_QUEUE", "", socket.gethostname())
    elif program == "estimate":
        worker("PORTAL_ESTIMATE_QUEUE", "-estimate", socket.gethostname())
    elif program == "render":
        worker("PORTAL_RENDER_QUEUE", "-render", host)
    elif program == "beat":
        beat()
    elif program == "agent":
        agent()
    elif program == "fence":
        import django

        django.setup()
        from django.conf import settings

        from sessions.runtime.firewall import Firewall
        from sessions.runtime.network import host_bridge

        fenced = settings.USER_NETWORK
        if os.environ.get("PORTAL_HUB_SPAWNER") == "swarm":  # a Swarm host's docker0 (entrypoint's fence)
            fenced = host_bridge(settings.USER_NETWORK, os.environ["PORTAL_HUB_BIND_URL"], "docker0")
        if not Firewall(fenced).in_place():
            raise SystemExit(f"the fence of {getattr(fenced, 'bridge', fenced.name)} is not in place")
    elif program == "hub":
        # Where the portal calls it: the notebook network's gateway, or PORTAL_HUB_BIND_URL, where it listens.
        from sessions.runtime.network import from_environ

        answers(f"{os.environ.get('PORTAL_HUB_BIND_URL') or from_environ(os.environ).hub_url}/jupyter/hub/api/")
    elif program == "proxy":
        answers(f"http://127.0.0.1:{os.environ.get('PORTAL_PORT', '8000')}/jupyter/hub/api/")
    else:
        raise SystemExit(f"no health check for {program!r}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "web")
