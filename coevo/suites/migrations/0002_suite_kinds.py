from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("suites", "0001_initial"),
    ]

    operations = [
        migrations.AlterField(
            model_name="suite",
            name="kind",
            field=models.CharField(
                choices=[
                    ("humaneval", "HumanEval"),
                    ("textworld", "TextWorld"),
                    ("jsonl", "custom (JSONL)"),
                ],
                max_length=32,
            ),
        ),
        migrations.AddField(
            model_name="suite",
            name="scorer",
            field=models.JSONField(blank=True, default=dict),
        ),
    ]
