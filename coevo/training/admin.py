from django.contrib import admin

from coevo.training.models import Trainer, TrainingRun


@admin.register(Trainer)
class TrainerAdmin(admin.ModelAdmin):
    """Staff only (the admin site): a trainer's command runs outside any sandbox."""

    list_display = ("name", "enabled", "time_limit_s", "updated_at")
    list_filter = ("enabled",)
    search_fields = ("name", "description")


@admin.register(TrainingRun)
class TrainingRunAdmin(admin.ModelAdmin):
    list_display = ("id", "project", "trainer", "state", "policy_version", "created_at")
    list_filter = ("state", "trainer")
    readonly_fields = [f.name for f in TrainingRun._meta.fields]

    def has_add_permission(self, request) -> bool:  # runs are created by campaigns and the API
        return False
