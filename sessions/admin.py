"""Admin views of the fleet records, of notebook images and sessions, and of storage quotas.

Operators change GPUs through the fleet pages, not here. Images are edited here; of a session only its
idle exemption is, and through the service: a session's lifecycle is never written by a form.
"""

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from sessions.gpus.models import Gpu, GpuHost, GpuInstance, Slice, SliceQuota
from sessions.notebooks.models import NotebookImage, NotebookSession
from sessions.notebooks.services import exempt_from_idle_stop
from sessions.storage.models import GroupStorageQuota, StorageQuota, StorageUse


@admin.register(GpuHost)
class GpuHostAdmin(admin.ModelAdmin[GpuHost]):
    list_display = ["name", "backend", "driver_version", "last_seen"]
    readonly_fields = ["name", "backend", "driver_version", "last_seen", "problem"]


@admin.register(Gpu)
class GpuAdmin(admin.ModelAdmin[Gpu]):
    list_display = ["__str__", "uuid", "sharing", "mig_policy", "state", "active_slices"]
    list_filter = ["sharing", "state", "model_name", "host"]
    readonly_fields = [field.name for field in Gpu._meta.fields]


@admin.register(GpuInstance)
class GpuInstanceAdmin(admin.ModelAdmin[GpuInstance]):
    list_display = ["gpu", "profile", "start", "device_uuid", "origin"]
    readonly_fields = [field.name for field in GpuInstance._meta.fields]


@admin.register(Slice)
class SliceAdmin(admin.ModelAdmin[Slice]):
    list_display = ["__str__", "kind", "holder", "allocated_at", "released_at"]
    list_filter = ["kind", "released_at"]
    readonly_fields = [field.name for field in Slice._meta.fields]


@admin.register(SliceQuota)
class SliceQuotaAdmin(admin.ModelAdmin[SliceQuota]):
    list_display = ["user", "max_slices"]
    autocomplete_fields = ["user"]


@admin.register(StorageQuota)
class StorageQuotaAdmin(admin.ModelAdmin[StorageQuota]):
    """A person's own storage quota: it overrides their groups' and PORTAL_STORAGE_QUOTA_BYTES."""

    list_display = ["user", "gib"]
    autocomplete_fields = ["user"]


@admin.register(GroupStorageQuota)
class GroupStorageQuotaAdmin(admin.ModelAdmin[GroupStorageQuota]):
    """A group's storage quota for each member (the largest of a person's groups' applies)."""

    list_display = ["group", "gib"]
    autocomplete_fields = ["group"]


@admin.register(StorageUse)
class StorageUseAdmin(admin.ModelAdmin[StorageUse]):
    """What each person's files take, as last measured: read-only, the measures write it."""

    list_display = ["owner", "kind", "label", "bytes", "measured_at"]
    list_filter = ["kind"]
    search_fields = ["owner__username", "label"]
    readonly_fields = [field.name for field in StorageUse._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: StorageUse | None = None) -> bool:
        return False


@admin.register(NotebookImage)
class NotebookImageAdmin(admin.ModelAdmin[NotebookImage]):
    list_display = ["name", "image", "default", "enabled"]
    list_filter = ["enabled"]
    search_fields = ["name", "image"]


# Everything of a session but its exemption: the lifecycle the services write, shown, never edited.
SESSION_RECORD = [f.name for f in NotebookSession._meta.fields if f.name not in ("id", "idle_exempt")]


@admin.register(NotebookSession)
class NotebookSessionAdmin(admin.ModelAdmin[NotebookSession]):
    list_display = ["server_name", "owner", "state", "slice", "requested_at", "idle_exempt"]
    list_filter = ["state", "idle_exempt", "spot", "ended_reason"]
    list_select_related = ["owner", "slice__gpu__host", "slice__owner"]
    search_fields = ["server_name", "owner__username"]
    date_hierarchy = "requested_at"
    fields = ["idle_exempt", *SESSION_RECORD]
    readonly_fields = SESSION_RECORD
    actions = ["exempt", "unexempt"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # sessions start from the portal's form, with a slice

    def has_delete_permission(self, request: HttpRequest, obj: NotebookSession | None = None) -> bool:
        return False  # what billing charges from is never deleted

    def save_model(self, request: HttpRequest, obj: NotebookSession, form: forms.ModelForm[Any], change: bool) -> None:
        # Not obj.save(): only the services change sessions, and a save would write back every field as
        # this request read it, over a state change the services made in between.
        if "idle_exempt" in form.changed_data:
            exempt_from_idle_stop(obj.pk, obj.idle_exempt)

    @admin.action(description="Exempt from the idle stop (the maximum age still applies)", permissions=["change"])
    def exempt(self, request: HttpRequest, sessions: QuerySet[NotebookSession]) -> None:
        self._set_exempt(request, sessions, True)

    @admin.action(description="Stop when idle again", permissions=["change"])
    def unexempt(self, request: HttpRequest, sessions: QuerySet[NotebookSession]) -> None:
        self._set_exempt(request, sessions, False)

    def _set_exempt(self, request: HttpRequest, sessions: QuerySet[NotebookSession], exempt: bool) -> None:
        chosen = list(sessions.values_list("pk", flat=True))
        for session_id in chosen:
            exempt_from_idle_stop(session_id, exempt)
        done = "exempted from" if exempt else "subject to"
        self.message_user(request, f"{len(chosen)} session(s) {done} the idle stop.", messages.SUCCESS)
