"""Admin views of notebook images and sessions. Images are edited here; of a session only its idle exemption
is, and through the service: a session's lifecycle is never written by a form."""

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from sessions.notebooks.models import NotebookImage, NotebookSession
from sessions.notebooks.services import exempt_from_idle_stop


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
