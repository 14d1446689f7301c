"""Who may see and act on which notebook sessions, render jobs and slices: one rule per object type.

Views, consumers, the internal API and the services ask here and nowhere else.
People reach their own; operators may also view and stop anyone's. Whatever
someone may not reach answers as if it did not exist (404), so nobody learns
what others run.
"""

from __future__ import annotations

from enum import StrEnum
from typing import TypeVar

from django.contrib.auth.models import AnonymousUser, User
from django.db.models import Model, QuerySet
from django.http import Http404

from portal.roles import is_operator
from sessions.gpus.models import Slice
from sessions.notebooks.models import NotebookSession
from sessions.render.models import RenderJob

Person = User | AnonymousUser
Owned = TypeVar("Owned", bound=Model)


class Action(StrEnum):
    VIEW = "view"
    STOP = "stop"  # a session; cancel, for a render job
    RELEASE = "release"  # a slice
    HUB = "hub"  # the hub acting for the owner: the launch spec, lifecycle events
    CONFIGURE = "configure"  # a render job's settings before it runs (its main file, confirming): its owner's alone
    REQUEUE = "requeue"  # a failed render job's frames queued again
    COST = "cost"  # what a slice's holding has cost so far: its owner's money, its owner's alone
    REMOVE_FILES = "remove_files"  # an ended render job's files, before retention would remove them


# Operators run the fleet: they may look at and end anyone's work, never act as its owner.
# Removing an ended job's files is theirs too: it frees a host's disk, as retention would later.
OPERATOR_ACTIONS = frozenset({Action.VIEW, Action.STOP, Action.RELEASE, Action.REQUEUE, Action.REMOVE_FILES})


class NotFound(Http404):
    """Nothing of that number that this person may reach; a view answers 404."""


def may(person: Person, action: Action, owned: NotebookSession | RenderJob | Slice) -> bool:
    """The rule itself, for a row already in hand (a service that has locked it, say)."""
    return _reaches_everyone(person, action) or (person.is_authenticated and owned.owner_id == person.pk)


def sessions_for(person: Person, action: Action = Action.VIEW) -> QuerySet[NotebookSession]:
    return _scoped(NotebookSession.objects.all(), person, action)


def session_for(person: Person, session_id: int, action: Action = Action.VIEW) -> NotebookSession:
    found = sessions_for(person, action).select_related("slice__gpu__host", "image", "owner")
    session = found.filter(pk=session_id).first()
    if session is None:
        raise NotFound("No such session among yours.")
    return session


def sessions_for_hub_user(username: str) -> QuerySet[NotebookSession]:
    """What the hub may drive for the person it names (its user names are ours, through our OAuth)."""
    return NotebookSession.objects.filter(owner__username=username) if username else NotebookSession.objects.none()


def render_jobs_for(person: Person, action: Action = Action.VIEW) -> QuerySet[RenderJob]:
    return _scoped(RenderJob.objects.all(), person, action)


def render_job_for(person: Person, job_id: int, action: Action = Action.VIEW) -> RenderJob:
    job = render_jobs_for(person, action).select_related("owner").filter(pk=job_id).first()
    if job is None:
        raise NotFound("No such render job among yours.")
    return job


def slices_for(person: Person, action: Action = Action.VIEW) -> QuerySet[Slice]:
    return _scoped(Slice.objects.all(), person, action)


def slice_for(person: Person, slice_id: int, action: Action = Action.VIEW) -> Slice:
    taken = slices_for(person, action).select_related("gpu__host").filter(pk=slice_id).first()
    if taken is None:
        raise NotFound("No such slice among yours.")
    return taken


def _reaches_everyone(person: Person, action: Action) -> bool:
    return action in OPERATOR_ACTIONS and is_operator(person)


def _scoped(found: QuerySet[Owned], person: Person, action: Action) -> QuerySet[Owned]:
    if _reaches_everyone(person, action):
        return found
    if not person.is_authenticated:
        return found.none()
    return found.filter(owner_id=person.pk)
