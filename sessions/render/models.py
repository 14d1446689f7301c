"""Render jobs, the chunks of frames they are cut into, and each frame's result.

A job moves through its states only by ``RenderJob.move``, which knows every allowed step and writes
the moment that step records; the services in ``sessions/render/jobs.py`` lock the row, move it and
save the fields it names. Chunks hold a slice while they render; the slice records the job as its
holder, so billing charges a render job the way it charges a notebook.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from django.conf import settings
from django.db import models
from django.utils import timezone

from sessions.gpus.models import Slice

if TYPE_CHECKING:
    from sessions.gpus.allocator import SliceRequest


class RenderJob(models.Model):
    class State(models.TextChoices):
        UNPACKING = "unpacking", "Unpacking"
        UPLOADED = "uploaded", "Uploaded"
        VALIDATED = "validated", "Checked"
        ESTIMATING = "estimating", "Estimating"
        AWAITING_CONFIRMATION = "awaiting_confirmation", "Waiting for your confirmation"
        QUEUED = "queued", "Queued"
        RENDERING = "rendering", "Rendering"
        DONE = "done", "Done"
        FAILED = "failed", "Failed"
        CANCELLED = "cancelled", "Cancelled"

    class OutputFormat(models.TextChoices):
        PNG = "PNG", "PNG"
        OPEN_EXR = "OPEN_EXR", "OpenEXR"

    # Every step a job may take, in one place. A failed job may be queued again (its failed frames).
    NEXT: dict[str, frozenset[str]] = {
        # A Celery task unpacks (or decompresses) and checks the scene, off the request and outside any lock.
        State.UNPACKING: frozenset({State.UPLOADED, State.VALIDATED, State.FAILED, State.CANCELLED}),
        State.UPLOADED: frozenset({State.UNPACKING, State.FAILED, State.CANCELLED}),
        State.VALIDATED: frozenset({State.ESTIMATING, State.FAILED, State.CANCELLED}),
        State.ESTIMATING: frozenset({State.AWAITING_CONFIRMATION, State.FAILED, State.CANCELLED}),
        State.AWAITING_CONFIRMATION: frozenset({State.QUEUED, State.ESTIMATING, State.CANCELLED}),
        State.QUEUED: frozenset({State.RENDERING, State.FAILED, State.CANCELLED}),
        State.RENDERING: frozenset({State.DONE, State.FAILED, State.CANCELLED, State.QUEUED}),
        State.DONE: frozenset(),
        State.FAILED: frozenset({State.QUEUED}),
        State.CANCELLED: frozenset(),
    }
    ENDED = (State.DONE, State.FAILED, State.CANCELLED)
    # Before it is queued nothing of it runs on a slice: cancelling only removes its files.
    BEFORE_QUEUE = (State.UNPACKING, State.UPLOADED, State.VALIDATED, State.AWAITING_CONFIRMATION)
    # Confirmed and not ended: its chunks wait for or hold slices.
    RUNNING = (State.QUEUED, State.RENDERING)

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="render_jobs")
    state = models.CharField(max_length=24, choices=State.choices, default=State.UNPACKING)
    upload_name = models.CharField(max_length=255, help_text="The uploaded file's name, as the browser sent it.")
    folder = models.CharField(
        max_length=200, help_text="The job's folder, relative to PORTAL_RENDER_DIR: <owner's folder>/<random name>."
    )
    main_file = models.CharField(
        max_length=1024, blank=True, help_text="The .blend to render, relative to the job's scene folder."
    )
    blend_files = models.JSONField(
        default=list, blank=True, help_text="The .blend files its zip held; its owner picks the main one among them."
    )
    upload_bytes = models.PositiveBigIntegerField(default=0)
    scene_bytes = models.PositiveBigIntegerField(default=0, help_text="What the scene holds on disk, unpacked.")
    scene_sha256 = models.CharField(
        max_length=64,
        blank=True,
        db_default="",
        help_text="Of the unpacked scene's files (their paths, sizes and contents), as unpacking recorded it; "
        "every render worker checks what it is given against it (sessions/render/filestore.py).",
    )
    blender_version = models.CharField(max_length=10, blank=True, help_text="The version that saved the main file.")
    frame_spec = models.CharField(max_length=500, help_text="The frames as typed: 1-30, 45, 50-60x2.")
    frames = models.JSONField(default=list, help_text="The frames that spec names, ascending.")
    frame_count = models.PositiveIntegerField(default=0)
    resolution_percent = models.PositiveSmallIntegerField(default=100)
    samples = models.PositiveIntegerField(null=True, blank=True, help_text="Empty: the scene's own sample count.")
    output_format = models.CharField(max_length=10, choices=OutputFormat.choices, default=OutputFormat.PNG)
    gpu_kind = models.CharField(max_length=10, choices=Slice.Kind.choices)
    gpu_profile = models.CharField(max_length=32, blank=True)
    gpu_model = models.CharField(max_length=64, blank=True)
    market = models.CharField(max_length=10, choices=Slice.Market.choices, default=Slice.Market.ON_DEMAND)
    chunk_size = models.PositiveIntegerField(default=1, help_text="Frames per chunk (one container run).")
    max_slices = models.PositiveSmallIntegerField(default=1, help_text="Slices the job may hold at once.")
    created_at = models.DateTimeField(default=timezone.now)
    state_since = models.DateTimeField(
        default=timezone.now,
        help_text="When it took its last step: a job left waiting for its owner (uploaded, awaiting confirmation) "
        "is cancelled PORTAL_RENDER_UNFINISHED_EXPIRY_HOURS after.",
    )
    queued_at = models.DateTimeField(null=True, blank=True, help_text="When its owner confirmed the estimate.")
    started_at = models.DateTimeField(null=True, blank=True, help_text="When its first chunk began to render.")
    finished_at = models.DateTimeField(null=True, blank=True, help_text="When it was done, failed or cancelled.")
    failure_message = models.TextField(
        blank=True, help_text="What its owner is told, in words: why it failed, or why the portal cancelled it."
    )
    estimate_sent_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="When the probe's task last went to the broker or last ran; empty: never sent (the broker did "
        "not answer), so reconciliation sends it.",
    )
    unpack_sent_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="When the unpacking task last reached the broker; empty: never (the broker did not answer), so "
        "reconciliation sends it.",
    )
    unpack_heard_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="When a task unpacking it last said it runs; one silent for long was lost with its worker.",
    )
    files_removed_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="When its files (scene, frames, thumbnails, estimate) were removed: at a cancel before it was "
        "queued, or PORTAL_RENDER_RETENTION_DAYS after it ended. This row, its chunks, frames and charges stay.",
    )

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            models.Index(fields=["owner", "-created_at"], name="render_job_owner_idx"),
            models.Index(fields=["state"], name="render_job_state_idx"),
        ]

    class BadStep(ValueError):
        """A step the job's state does not allow (cancelling a finished job, say)."""

    def __str__(self) -> str:
        return f"render job {self.pk} of {self.owner} ({self.state})"

    @property
    def request(self) -> SliceRequest:
        """The slice each of its chunks asks for: the offer its owner picked, on its market."""
        from sessions.gpus.allocator import SliceRequest  # the allocator is no model module's import

        return SliceRequest(kind=self.gpu_kind, profile=self.gpu_profile, model=self.gpu_model, market=self.market)

    @property
    def offer_key(self) -> str:
        return f"{self.gpu_kind}:{self.gpu_model}:{self.gpu_profile}"

    @property
    def spot(self) -> bool:
        return self.market == Slice.Market.SPOT

    @property
    def ended(self) -> bool:
        return self.state in self.ENDED

    @property
    def scene_name(self) -> str:
        """The main .blend as its owner knows it: the uploaded file's own name, or its path in the zip (an
        uploaded .blend is stored as ``scene.blend``)."""
        return self.upload_name if self.main_file and not self.blend_files else self.main_file

    def folder_path(self) -> Path:
        return Path(settings.RENDER_DIR) / self.folder

    def scene_path(self) -> Path:
        """The folder a render mounts read-only: the uploaded .blend, or what the zip held."""
        return self.folder_path() / "scene"

    def may_move(self, to: str) -> bool:
        return to in self.NEXT[self.state]

    def move(self, to: State, message: str = "", when: datetime | None = None) -> list[str]:
        """Take one step (in memory) and write the moment it records; returns the fields to save.
        BadStep if the current state does not lead there."""
        if not self.may_move(to):
            raise self.BadStep(f"A job that is {self.get_state_display().lower()} cannot become {to.label.lower()}.")
        now = when or timezone.now()
        self.state_since = now
        changed = ["state", "state_since"]
        if to == self.State.QUEUED and self.queued_at is None:
            self.queued_at = now
            changed.append("queued_at")
        if to == self.State.RENDERING and self.started_at is None:
            self.started_at = now
            changed.append("started_at")
        if to in self.ENDED:  # a cancel may say why too (one the portal made: an unfinished job expired)
            self.finished_at, self.failure_message = now, message if to != self.State.DONE else ""
            changed += ["finished_at", "failure_message"]
        elif self.state == self.State.FAILED:  # queued again: no longer finished, nor failed
            self.finished_at, self.failure_message = None, ""
            changed += ["finished_at", "failure_message"]
        self.state = to
        return changed

    @property
    def files_kept_days(self) -> int | None:
        """Whole days its files were kept after it ended; None while they are there (or if it never ended)."""
        if self.files_removed_at is None or self.finished_at is None:
            return None
        return (self.files_removed_at - self.finished_at).days

    @property
    def badge(self) -> tuple[str, str]:
        """The state as its owner sees it, and its tone."""
        tone = {self.State.DONE: "good", self.State.FAILED: "bad", self.State.CANCELLED: "neutral"}
        return self.get_state_display(), tone.get(self.State(self.state), "warn")

    def badge_for(self, viewer_id: int | None) -> tuple[str, str]:
        """The badge as ``viewer_id`` sees it: staff looking at another person's job see it wait for its
        owner's confirmation, not theirs."""
        label, tone = self.badge
        if self.state == self.State.AWAITING_CONFIRMATION and viewer_id != self.owner_id:
            label = "Waiting for its owner's confirmation"
        return label, tone


class RenderChunk(models.Model):
    """Some of a job's frames, rendered by one container run on one slice; retried on failure."""

    class State(models.TextChoices):
        PENDING = "pending", "Waiting for a slice"
        RENDERING = "rendering", "Rendering"
        DONE = "done", "Done"
        FAILED = "failed", "Failed"
        CANCELLED = "cancelled", "Cancelled"

    job = models.ForeignKey(RenderJob, on_delete=models.CASCADE, related_name="chunks")
    index = models.PositiveIntegerField(help_text="Its place in the job, from 0.")
    frames = models.JSONField(help_text="The frames it renders, ascending.")
    state = models.CharField(max_length=12, choices=State.choices, default=State.PENDING)
    attempts = models.PositiveSmallIntegerField(default=0)
    slice = models.ForeignKey(Slice, on_delete=models.PROTECT, null=True, blank=True, related_name="render_chunks")
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    log_excerpt = models.TextField(blank=True, help_text="The end of Blender's output on its last attempt.")

    class Meta:
        ordering = ["job", "index"]
        constraints = [models.UniqueConstraint(fields=["job", "index"], name="render_chunk_unique_index")]

    def __str__(self) -> str:
        return f"chunk {self.index} of job {self.job_id} ({self.state})"


class RenderFrame(models.Model):
    """One frame of a job: whether it is rendered, and where its image and thumbnail are."""

    class State(models.TextChoices):
        PENDING = "pending", "Pending"
        RENDERING = "rendering", "Rendering"
        DONE = "done", "Done"
        FAILED = "failed", "Failed"

    job = models.ForeignKey(RenderJob, on_delete=models.CASCADE, related_name="frame_results")
    number = models.IntegerField()
    state = models.CharField(max_length=12, choices=State.choices, default=State.PENDING)
    output_path = models.CharField(max_length=1024, blank=True, help_text="Relative to the job's folder.")
    thumbnail_path = models.CharField(max_length=1024, blank=True, help_text="Relative to the job's folder.")
    sha256 = models.CharField(
        max_length=64, blank=True, db_default="", help_text="Of the frame's file, as the render worker stored it."
    )
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["job", "number"]
        constraints = [models.UniqueConstraint(fields=["job", "number"], name="render_frame_unique_number")]

    def __str__(self) -> str:
        return f"frame {self.number} of job {self.job_id} ({self.state})"


class RenderUpload(models.Model):
    """A scene on its way up, in parts (the tus protocol): assembled on disk in the folder that becomes its job's,
    resumable after a dropped connection, until its owner's form turns it into a job (and this row goes)."""

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="render_uploads")
    token = models.CharField(max_length=32, unique=True, help_text="Its address: 128 random bits.")
    folder = models.CharField(max_length=200, help_text="Relative to PORTAL_RENDER_DIR: <owner's folder>/<random>.")
    name = models.CharField(max_length=255, help_text="The file's name, as the browser sent it.")
    kind = models.CharField(max_length=8, help_text="blend or zip, from the name.")
    length = models.PositiveBigIntegerField(help_text="The whole file's size, declared when it began.")
    offset = models.PositiveBigIntegerField(default=0, help_text="How much of it is on disk.")
    sha256 = models.CharField(max_length=64, blank=True, help_text="Of the whole file, once every byte is in.")
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now, help_text="When its last part arrived.")

    class Meta:
        indexes = [models.Index(fields=["owner", "created_at"], name="render_upload_owner_idx")]

    def __str__(self) -> str:
        return f"upload {self.name} of {self.owner} ({self.offset} of {self.length} bytes)"

    @property
    def complete(self) -> bool:
        return self.offset == self.length

    def folder_path(self) -> Path:
        return Path(settings.RENDER_DIR) / self.folder
