from typing import Any

from django import forms
from django.contrib import admin

from coevo.errors import CoevoError
from coevo.training.models import Trainer, TrainingRun
from coevo.training.trainers import trainer_audit, trainer_validate


class TrainerForm(forms.ModelForm):
    class Meta:
        model = Trainer
        fields = ["name", "description", "command", "env", "time_limit_s", "enabled"]

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        if not self.errors:
            try:
                trainer_validate(
                    command=data.get("command"),
                    time_limit_s=data.get("time_limit_s"),
                    env=data.get("env") or {},
                )
            except CoevoError as exc:
                raise forms.ValidationError(str(exc)) from exc
        return data


@admin.register(Trainer)
class TrainerAdmin(admin.ModelAdmin):
    """Staff only (the admin site): a trainer's command runs outside any sandbox. The same
    checks as ``manage.py trainer_register``, and every change is in the audit log."""

    form = TrainerForm
    list_display = ("name", "enabled", "time_limit_s", "updated_at")
    list_filter = ("enabled",)
    search_fields = ("name", "description")

    def save_model(self, request: Any, obj: Trainer, form: Any, change: bool) -> None:
        super().save_model(request, obj, form, change)
        action = "trainer.changed" if change else "trainer.registered"
        trainer_audit(trainer=obj, actor=request.user, action=action)


@admin.register(TrainingRun)
class TrainingRunAdmin(admin.ModelAdmin):
    list_display = ("id", "project", "trainer", "state", "policy_version", "created_at")
    list_filter = ("state", "trainer")
    readonly_fields = [f.name for f in TrainingRun._meta.fields]

    def has_add_permission(self, request: Any) -> bool:  # created by campaigns and the API
        return False
