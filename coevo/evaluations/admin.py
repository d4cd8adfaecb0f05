from django.contrib import admin

from coevo.evaluations.models import Evaluation, Rollout


@admin.register(Evaluation)
class EvaluationAdmin(admin.ModelAdmin):
    list_display = ["id", "project", "candidate", "split", "state", "created_at"]
    list_filter = ["state", "split"]


@admin.register(Rollout)
class RolloutAdmin(admin.ModelAdmin):
    list_display = ["id", "evaluation", "task", "epoch", "state", "outcome", "score"]
    list_filter = ["state", "outcome"]
    raw_id_fields = ["evaluation", "task"]
