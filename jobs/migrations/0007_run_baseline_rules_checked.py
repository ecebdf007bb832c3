import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0006_inspected_samples"),
    ]

    operations = [
        migrations.AddField(
            model_name="run",
            name="baseline_run",
            field=models.ForeignKey(
                blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL,
                related_name="baseline_for", to="jobs.run"),
        ),
        migrations.AddField(
            model_name="run",
            name="rules_checked",
            field=models.JSONField(blank=True, default=dict, editable=False),
        ),
    ]
