"""Withdraw results the rollout cache carried across the held-out seal (issue 15).

Before cache version 2 the key named neither the project nor the split, so a search or
validation rollout could copy a held-out rollout's outcome, score, answer and detail (which
names the held-out rollout), and an evaluation could copy another project's results. Such a
copy is withdrawn: it becomes an infra error (never counted as a score; resuming the
evaluation runs it for real) and loses every field that came from its source.
"""

from django.db import migrations
from django.db.models import F, Q

WITHDRAWN_DETAIL = (
    "This result was reused from a rollout this evaluation may not see (another project, "
    "another split or the sealed held-out split) and was withdrawn. It does not count; "
    "resume or rerun the evaluation to run this task."
)


def leaked_reuse(Rollout):
    """Reused rollouts whose source the cache may not serve them any more."""
    return Rollout.objects.filter(reused_from__isnull=False).filter(
        Q(evaluation__split="heldout")
        | Q(reused_from__evaluation__split="heldout")
        | ~Q(reused_from__evaluation__split=F("evaluation__split"))
        | ~Q(reused_from__evaluation__project_id=F("evaluation__project_id"))
    )


def withdraw(apps, schema_editor):
    Rollout = apps.get_model("evaluations", "Rollout")
    ids = list(leaked_reuse(Rollout).values_list("id", flat=True))
    Rollout.objects.filter(id__in=ids).update(
        reused_from=None,
        cache_key="",
        outcome="infra_error",
        error_kind="cache_withdrawn",
        score=None,
        answer=None,
        detail=WITHDRAWN_DETAIL,
        prompt_tokens=0,
        completion_tokens=0,
        model_calls=0,
        latency_ms=0,
    )


class Migration(migrations.Migration):
    dependencies = [
        ("evaluations", "0005_traces_pruned_at"),
    ]

    operations = [
        migrations.RunPython(withdraw, migrations.RunPython.noop),
    ]
