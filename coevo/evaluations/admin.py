from django.contrib import admin

from coevo.evaluations.models import Budget, Evaluation, Rollout


@admin.register(Evaluation)
class EvaluationAdmin(admin.ModelAdmin):
    list_display = ["id", "project", "candidate", "split", "state", "stage", "created_at"]
    list_filter = ["state", "split"]


@admin.register(Rollout)
class RolloutAdmin(admin.ModelAdmin):
    list_display = ["id", "evaluation", "task", "epoch", "state", "outcome", "score"]
    list_filter = ["state", "outcome"]
    raw_id_fields = ["evaluation", "task"]


@admin.register(Budget)
class BudgetAdmin(admin.ModelAdmin):
    list_display = ["name", "project", "limit_rollouts", "limit_tokens", "spent_rollouts"]
    readonly_fields = [
        "reserved_rollouts",
        "reserved_tokens",
        "reserved_wall_s",
        "spent_rollouts",
        "spent_tokens",
        "spent_wall_s",
    ]
    raw_id_fields = ["evaluation", "parent"]
