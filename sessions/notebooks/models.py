"""Notebook sessions and the images people may start them from.

A session's lifecycle moments (requested, container started, ready, container
gone) are what billing charges from: each is written once, by the state
transition that owns it, and never moved afterwards.
"""

from __future__ import annotations

import uuid
from datetime import datetime

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone

from sessions.gpus.models import Slice


class NotebookImage(models.Model):
    """A container image staff allow for sessions."""

    name = models.CharField(max_length=100, unique=True)
    image = models.CharField(max_length=255, help_text="Docker image reference, e.g. gpu-portal/notebook:latest.")
    description = models.CharField(max_length=255, blank=True)
    default = models.BooleanField(default=False)
    enabled = models.BooleanField(default=True)

    class Meta:
        ordering = ["-default", "name"]

    def __str__(self) -> str:
        return self.name


def new_volume_name() -> str:
    return f"gpu-portal-work-{uuid.uuid4().hex}"


class WorkVolume(models.Model):
    """The Docker volume that holds one person's work/ folder across sessions.

    Named by a random id made once per person, never by the database id: after a database reset,
    or beside a second portal on the same engine, a new account must not inherit someone's files.
    """

    owner = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="work_volume")
    name = models.CharField(max_length=100, unique=True, default=new_volume_name, editable=False)
    created_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"{self.owner} / {self.name}"

    @classmethod
    def for_owner(cls, owner_id: int) -> WorkVolume:
        volume, _ = cls.objects.get_or_create(owner_id=owner_id)
        return volume


class NotebookSession(models.Model):
    class State(models.TextChoices):
        REQUESTED = "requested", "Requested"
        ALLOCATING = "allocating", "Allocating a GPU slice"
        STARTING = "starting", "Starting"
        RUNNING = "running", "Running"
        STOPPING = "stopping", "Stopping"
        STOPPED = "stopped", "Stopped"
        FAILED = "failed", "Failed"
        PREEMPTED = "preempted", "Preempted"

    class EndReason(models.TextChoices):
        USER = "user", "Stopped by its owner"
        IDLE = "idle", "Stopped after being idle"
        MAX_AGE = "max_age", "Reached the maximum session age"
        FAILURE = "failure", "Could not start"
        CRASHED = "crashed", "Its container stopped unexpectedly"
        INSIDE = "inside", "Shut down from inside JupyterLab"
        RECONCILIATION = "reconciliation", "Its container was gone"
        STAFF = "staff", "Stopped by an operator"
        CREDIT = "credit", "Credit ran out"
        PREEMPTED = "preempted", "Reclaimed for an on-demand session (spot)"
        HOST_LOST = "host_lost", "Its GPU host stopped answering"

    ACTIVE = (State.REQUESTED, State.ALLOCATING, State.STARTING, State.RUNNING, State.STOPPING)
    ENDED = (State.STOPPED, State.FAILED, State.PREEMPTED)
    CHANGING = (State.ALLOCATING, State.STARTING, State.STOPPING)  # the cards poll while one is in these

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="notebook_sessions")
    server_name = models.SlugField(max_length=40, help_text="The named server in JupyterHub.")
    display_name = models.CharField(max_length=80, blank=True)
    image = models.ForeignKey(NotebookImage, on_delete=models.PROTECT)
    slice = models.OneToOneField(Slice, on_delete=models.PROTECT, null=True, blank=True, related_name="notebook")
    spot = models.BooleanField(default=False, help_text="Spot sessions are cheaper and may be reclaimed.")
    state = models.CharField(max_length=12, choices=State.choices, default=State.REQUESTED)
    progress = models.PositiveSmallIntegerField(default=0)
    progress_message = models.CharField(max_length=200, blank=True)
    progress_at = models.DateTimeField(null=True, blank=True, help_text="When the current launch step began.")
    requested_at = models.DateTimeField(default=timezone.now)
    container_started_at = models.DateTimeField(null=True, blank=True)
    ready_at = models.DateTimeField(null=True, blank=True)
    container_gone_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True, help_text="When the portal recorded the end.")
    ended_reason = models.CharField(max_length=20, choices=EndReason.choices, blank=True)
    failure_message = models.TextField(blank=True, help_text="What its owner is told, in words.")
    failure_detail = models.TextField(blank=True, help_text="The technical cause, for operators only.")
    container_id = models.CharField(max_length=80, blank=True)
    start_sent_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="When its start's task last reached the broker or last ran; empty: never (the broker did not "
        "answer), so reconciliation sends it again.",
    )
    stop_sent_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="When the hub last took the request to stop its server; empty: it has not (it did not answer), "
        "so reconciliation asks again.",
    )
    last_activity = models.DateTimeField(null=True, blank=True)
    idle_exempt = models.BooleanField(default=False, help_text="Staff: never stop this session for being idle.")
    warned_at = models.DateTimeField(null=True, blank=True, help_text="When its owner was told it will be stopped.")
    warning = models.CharField(max_length=200, blank=True)

    class Meta:
        ordering = ["-requested_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["owner", "server_name"],
                condition=Q(state__in=["requested", "allocating", "starting", "running", "stopping"]),
                name="notebook_one_active_server_name_per_owner",
            )
        ]

    def __str__(self) -> str:
        return f"{self.owner} / {self.server_name} ({self.state})"

    @property
    def start_clock(self) -> datetime:
        """When its launch began to wait on the hub: when it got its slice, which for one handed a reclaimed
        spot slice is the grace time after its request."""
        return self.slice.allocated_at if self.slice_id and self.slice else self.requested_at

    @property
    def active(self) -> bool:
        return self.state in self.ACTIVE

    @property
    def slow_step(self) -> bool:
        """A start stuck at one step for longer than PORTAL_SLOW_STEP_SECONDS: the card says so."""
        if self.state != self.State.STARTING or self.progress_at is None:
            return False
        return (timezone.now() - self.progress_at).total_seconds() > settings.SLOW_STEP_SECONDS

    @property
    def spot_wait_percent(self) -> int:
        """How much of the spot grace time an allocating session has waited (it gets the slice at the end)."""
        if self.state != self.State.ALLOCATING or self.progress_at is None:
            return 0
        waited = (timezone.now() - self.progress_at).total_seconds()
        return min(99, round(100 * waited / max(settings.SPOT_GRACE_SECONDS, 1)))

    @property
    def badge(self) -> tuple[str, str]:
        """The state as its owner sees it, and its tone: a crash never looks like a normal stop."""
        if self.state == self.State.FAILED:
            crashed = self.ended_reason == self.EndReason.CRASHED
            return ("Crashed" if crashed else "Failed"), "bad"
        if self.state == self.State.RUNNING:
            return self.get_state_display(), "good"
        return self.get_state_display(), "warn" if self.active else "neutral"

    def stamp(self, field: str, when: datetime | None = None) -> bool:
        """Write a lifecycle moment once; later calls leave it as it was. Returns whether it was written."""
        if getattr(self, field) is not None:
            return False
        setattr(self, field, when or timezone.now())
        return True
