"""A render job as a kind of workload (``sessions.gpus.workloads``): whose it is, which are live (its probe runs,
or it is queued or rendering), and how one is stopped for a reason: its owner's or an operator's stop cancels it;
any other (credit ran out, spot reclaimed) fails it saying why, so its frames can be queued again."""

from __future__ import annotations

from django.contrib.auth.models import User

from sessions import access
from sessions.gpus.holders import HolderKind
from sessions.gpus.workloads import Reason
from sessions.render import services, slices, stopping
from sessions.render.models import RenderJob

LIVE = (RenderJob.State.ESTIMATING, *services.RUNNING)


class RenderJobs:
    kind = HolderKind.RENDER

    def owner_of(self, holder_id: int) -> int | None:
        return RenderJob.objects.filter(pk=holder_id).values_list("owner_id", flat=True).first()

    def live(self, owner_id: int | None = None) -> list[int]:
        found = RenderJob.objects.filter(state__in=LIVE)
        if owner_id is not None:
            found = found.filter(owner_id=owner_id)
        return list(found.order_by("pk").values_list("pk", flat=True))

    def names(self, holder_ids: list[int]) -> dict[int, str]:
        return dict(RenderJob.objects.filter(pk__in=holder_ids).values_list("pk", "upload_name"))

    def stop(self, holder_id: int, reason: str, by: User | None) -> None:
        job = RenderJob.objects.get(pk=holder_id)
        if by is not None and not access.may(by, access.Action.STOP, job):
            raise access.NotFound("No such render job among yours.")
        if reason in (Reason.USER, Reason.STAFF) and by is not None:
            stopping.cancel(holder_id)  # BadStep for one already ended: the caller says so
            return
        stopping.stop_for(holder_id, reason)

    def give_up(self, holder_id: int, slice_id: int, reason: str) -> None:
        """A job holds several slices: it gives the one taken back up and goes on on the others."""
        slices.give_up_slice(holder_id, slice_id, f"render job gave it up: {reason}")
