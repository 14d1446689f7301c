"""Which notebook sessions a person may reach, by the one rule (``sessions.access``)."""

from __future__ import annotations

from django.db.models import QuerySet

from sessions.access import Action, Person, one, scoped
from sessions.notebooks.models import NotebookSession


def sessions_for(person: Person, action: Action = Action.VIEW) -> QuerySet[NotebookSession]:
    return scoped(NotebookSession.objects.all(), person, action)


def session_for(person: Person, session_id: int, action: Action = Action.VIEW) -> NotebookSession:
    return one(sessions_for(person, action).select_related("slice__gpu__host", "image", "owner"), session_id, "session")


def sessions_for_hub_user(username: str) -> QuerySet[NotebookSession]:
    """What the hub may drive for the person it names (its user names are ours, through our OAuth)."""
    return NotebookSession.objects.filter(owner__username=username) if username else NotebookSession.objects.none()
