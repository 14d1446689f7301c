"""A notebook session as a kind of workload (``sessions.gpus.workloads``): whose it is, which are live, and how
one is stopped for a reason (its container stops, its holding is charged to the container's end)."""

from __future__ import annotations

from django.contrib.auth.models import User

from sessions.gpus.holders import HolderKind
from sessions.notebooks.models import NotebookSession
from sessions.notebooks.services import stop_session

State = NotebookSession.State
# Waiting for a spot slice, starting or running: a stop ends them (one already stopping is on its way).
LIVE = (State.ALLOCATING, State.STARTING, State.RUNNING)


class Notebooks:
    kind = HolderKind.NOTEBOOK

    def owner_of(self, holder_id: int) -> int | None:
        return NotebookSession.objects.filter(pk=holder_id).values_list("owner_id", flat=True).first()

    def live(self, owner_id: int | None = None) -> list[int]:
        found = NotebookSession.objects.filter(state__in=LIVE)
        if owner_id is not None:
            found = found.filter(owner_id=owner_id)
        return list(found.order_by("pk").values_list("pk", flat=True))

    def names(self, holder_ids: list[int]) -> dict[int, str]:
        return dict(NotebookSession.objects.filter(pk__in=holder_ids).values_list("pk", "server_name"))

    def stop(self, holder_id: int, reason: str, by: User | None) -> None:
        stop_session(holder_id, by=by, reason=reason)

    def give_up(self, holder_id: int, slice_id: int, reason: str) -> None:
        """A session runs on its one slice: giving it up stops the session."""
        stop_session(holder_id, by=None, reason=reason)
