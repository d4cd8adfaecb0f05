from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("evaluations", "0008_proposer_spend"),
    ]

    operations = [
        migrations.AddField(
            model_name="evaluation",
            name="paced",
            field=models.BooleanField(default=False),
        ),
    ]
