import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("campaigns", "0007_agentic_proposer"),
    ]

    operations = [
        migrations.AddField(
            model_name="campaign",
            name="batch_size",
            field=models.PositiveSmallIntegerField(default=1),
        ),
        migrations.AddField(
            model_name="campaign",
            name="drafting_batch",
            field=models.JSONField(blank=True, default=dict),
        ),
        migrations.AddConstraint(
            model_name="campaign",
            constraint=models.CheckConstraint(
                condition=models.Q(("batch_size__gte", 1), ("batch_size__lte", 16)),
                name="campaign_batch_size_range",
            ),
        ),
        migrations.AddField(
            model_name="proposal",
            name="batch",
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="proposal",
            name="eliminated_by",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="+",
                to="campaigns.proposal",
            ),
        ),
        migrations.AddField(
            model_name="proposal",
            name="eliminated_after_tasks",
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="proposal",
            name="eliminated_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="proposal",
            name="elimination",
            field=models.JSONField(blank=True, default=dict),
        ),
        migrations.AddField(
            model_name="proposal",
            name="rollouts_saved",
            field=models.PositiveIntegerField(default=0),
        ),
        migrations.RemoveConstraint(
            model_name="proposal",
            name="proposal_one_open_per_campaign",
        ),
        migrations.AddConstraint(
            model_name="proposal",
            constraint=models.UniqueConstraint(
                condition=models.Q(
                    ("batch__isnull", True), ("state__in", ["proposed", "evaluating"])
                ),
                fields=("campaign",),
                name="proposal_one_open_per_campaign",
            ),
        ),
    ]
