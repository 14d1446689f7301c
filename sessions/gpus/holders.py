"""What holds a slice: a notebook session or a render job, by id.

A slice records its holder (``Slice.holder``) and the moments its holder ran
on it (``Slice.held_from`` to ``Slice.held_until``: its container's start and
the moment it was gone, as Docker reports them). The billing meter reads those
and nothing else, so every kind of holder is billed the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import models
from django.db.models import CharField, Value
from django.db.models.expressions import Combinable
from django.db.models.functions import Cast, Concat
from django.urls import reverse

PAGES = {"notebook": "session-detail", "render": "render-job-detail"}  # each kind's page, by its id


class HolderKind(models.TextChoices):
    NOTEBOOK = "notebook", "Notebook session"
    RENDER = "render", "Render job"


@dataclass(frozen=True)
class Holder:
    kind: HolderKind
    id: int

    def __str__(self) -> str:
        """The holder as text, for container labels and metric frames: ``notebook:12``."""
        return f"{self.kind.value}:{self.id}"

    @property
    def label(self) -> str:
        """The holder as pages show it: ``Render job #5``, ``Notebook session #12``."""
        return f"{self.kind.label} #{self.id}"

    @property
    def url(self) -> str:
        """The holder's own page (its owner's and staff's to see)."""
        return reverse(PAGES[self.kind.value], args=[self.id])

    @classmethod
    def notebook(cls, session_id: int) -> Holder:
        return cls(HolderKind.NOTEBOOK, session_id)

    @classmethod
    def render(cls, job_id: int) -> Holder:
        return cls(HolderKind.RENDER, job_id)


def as_text(kind: Combinable, holder_id: Combinable) -> Concat:
    """``str(Holder)`` computed by the database from a holder's kind and id columns (e.g. ``OuterRef``s),
    to match rows that keep the holder as text (the metrics history): the format lives here alone."""
    return Concat(kind, Value(":"), Cast(holder_id, CharField()))
