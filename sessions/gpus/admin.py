"""Admin views of the fleet records: read-only (operators change GPUs through the fleet pages, not here), and
per-person slice limits."""

from django.contrib import admin

from sessions.gpus.models import Gpu, GpuHost, GpuInstance, Slice, SliceQuota


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
