"""Record why an evaluation is paused, so the watchdog resumes only policy outages.

Evaluations paused before this migration: those paused by their campaign say so in their state
detail ("its campaign was paused"); every other pause was the outage kind (no other caller paused
evaluations then)."""

from django.db import migrations, models


def classify_paused(apps, schema_editor):
    Evaluation = apps.get_model("evaluations", "Evaluation")
    paused = Evaluation.objects.filter(state="paused")
    paused.filter(state_detail__contains="its campaign was paused").update(pause_kind="campaign")
    paused.filter(pause_kind="").update(pause_kind="policy_outage")


class Migration(migrations.Migration):
    dependencies = [("evaluations", "0006_withdraw_sealed_cache_reuse")]

    operations = [
        migrations.AddField(
            model_name="evaluation",
            name="pause_kind",
            field=models.CharField(
                blank=True,
                choices=[
                    ("policy_outage", "Policy Outage"),
                    ("campaign", "Campaign"),
                ],
                max_length=16,
            ),
        ),
        migrations.RunPython(classify_paused, migrations.RunPython.noop),
        migrations.AddConstraint(
            model_name="evaluation",
            constraint=models.CheckConstraint(
                condition=(
                    models.Q(("state", "paused"), models.Q(("pause_kind", ""), _negated=True))
                    | models.Q(models.Q(("state", "paused"), _negated=True), ("pause_kind", ""))
                ),
                name="evaluation_pause_kind_iff_paused",
            ),
        ),
    ]
