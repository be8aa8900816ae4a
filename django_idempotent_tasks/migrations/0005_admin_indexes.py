import django.db.models
from django.db import migrations

import django_idempotent_tasks.models
from django_idempotent_tasks.migrations._operations import AddIndexConcurrentlyOnPostgres


class Migration(migrations.Migration):
    # CREATE INDEX CONCURRENTLY cannot run inside a transaction.
    atomic = False

    dependencies = [
        ("django_idempotent_tasks", "0004_attempt_history"),
    ]

    operations = [
        AddIndexConcurrentlyOnPostgres(
            model_name="idempotencyrecord",
            index=django_idempotent_tasks.models.PostgresPartialIndex(
                fields=["status", "id"],
                name="django_idempotent_status_idx",
                where=django.db.models.Q(("status__in", ["FAILED", "IN_PROGRESS"])),
            ),
        ),
        AddIndexConcurrentlyOnPostgres(
            model_name="idempotencyrecord",
            index=django.db.models.Index(fields=["created_at"], name="django_idempotent_created_idx"),
        ),
    ]
