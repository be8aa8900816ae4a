from __future__ import annotations

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_idempotent_tasks", "0005_admin_indexes"),
    ]

    operations = [
        migrations.AddField(
            model_name="idempotencyrecord",
            name="message",
            field=models.JSONField(
                blank=True,
                help_text="Outbox tasks only, while PENDING or FAILED: the message that publishes the call again.",
                null=True,
                verbose_name="message",
            ),
        ),
        migrations.AlterField(
            model_name="idempotencyrecord",
            name="status",
            field=models.CharField(
                choices=[
                    ("PENDING", "Pending"),
                    ("IN_PROGRESS", "In progress"),
                    ("SUCCEEDED", "Succeeded"),
                    ("FAILED", "Failed"),
                ],
                default="IN_PROGRESS",
                max_length=16,
                verbose_name="status",
            ),
        ),
    ]
