"""Who may see and act on what people own (notebook sessions, render jobs, slices): one rule for every kind.

The rule lives here; each domain scopes its own rows with it (``sessions.notebooks.access``,
``sessions.render.access``, the slices below), so this module knows no workload. Views, consumers, the
internal API and the services ask through those and nowhere else.
People reach their own; operators may also view and stop anyone's. Whatever
someone may not reach answers as if it did not exist (404), so nobody learns
what others run.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Protocol, TypeVar

from django.contrib.auth.models import AnonymousUser, User
from django.db.models import Model, QuerySet
from django.http import Http404

from portal.roles import is_operator
from sessions.gpus.models import Slice

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


class HasOwner(Protocol):
    owner_id: int


def may(person: Person, action: Action, owned: HasOwner) -> bool:
    """The rule itself, for a row already in hand (a service that has locked it, say)."""
    return reaches(person, action, owned.owner_id)


def reaches(person: Person, action: Action, owner_id: int | None) -> bool:
    """The rule for what ``owner_id`` owns (None: nobody's, or nothing there)."""
    if owner_id is None:
        return False
    return _reaches_everyone(person, action) or (person.is_authenticated and owner_id == person.pk)


def scoped(found: QuerySet[Owned], person: Person, action: Action) -> QuerySet[Owned]:
    """The rows of ``found`` this person may act on so."""
    if _reaches_everyone(person, action):
        return found
    if not person.is_authenticated:
        return found.none()
    return found.filter(owner_id=person.pk)


def one(found: QuerySet[Owned], pk: int, what: str) -> Owned:
    """The row of that number among ``found`` (scoped already); NotFound names ``what`` as its owner reads it."""
    row = found.filter(pk=pk).first()
    if row is None:
        raise NotFound(f"No such {what} among yours.")
    return row


def slices_for(person: Person, action: Action = Action.VIEW) -> QuerySet[Slice]:
    return scoped(Slice.objects.all(), person, action)


def slice_for(person: Person, slice_id: int, action: Action = Action.VIEW) -> Slice:
    return one(slices_for(person, action).select_related("gpu__host"), slice_id, "slice")


def _reaches_everyone(person: Person, action: Action) -> bool:
    return action in OPERATOR_ACTIONS and is_operator(person)
