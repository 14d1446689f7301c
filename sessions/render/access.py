"""Which render jobs a person may reach, by the one rule (``sessions.access``)."""

from __future__ import annotations

from django.db.models import QuerySet

from sessions.access import Action, Person, one, scoped
from sessions.render.models import RenderJob


def render_jobs_for(person: Person, action: Action = Action.VIEW) -> QuerySet[RenderJob]:
    return scoped(RenderJob.objects.all(), person, action)


def render_job_for(person: Person, job_id: int, action: Action = Action.VIEW) -> RenderJob:
    return one(render_jobs_for(person, action).select_related("owner"), job_id, "render job")
