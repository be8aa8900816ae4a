from __future__ import annotations

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("django_idempotent_tasks", "0003_claim_token")]

    operations = [
        migrations.AddField(
            model_name="idempotencyrecord",
            name="attempts_log",
            field=models.JSONField(
                blank=True,
                default=list,
                help_text="The last claims of the key: holder, task id, times and how each ended.",
                verbose_name="attempts log",
            ),
        ),
    ]
