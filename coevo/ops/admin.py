from django.contrib import admin

from coevo.ops.models import WorkerHeartbeat


@admin.register(WorkerHeartbeat)
class WorkerHeartbeatAdmin(admin.ModelAdmin):
    list_display = ("hostname", "pid", "concurrency", "version", "last_seen_at", "stopped_at")
    search_fields = ("hostname",)
    readonly_fields = [f.name for f in WorkerHeartbeat._meta.fields]
