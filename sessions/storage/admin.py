"""Admin views of storage quotas (a person's, a group's) and of what each person's files take (read-only)."""

from django.contrib import admin
from django.http import HttpRequest

from sessions.storage.models import GroupStorageQuota, StorageQuota, StorageUse


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
