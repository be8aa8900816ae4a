from __future__ import annotations

from importlib import import_module

import django.db.models
from django.db import migrations

import django_idempotent_tasks.models

# CREATE INDEX CONCURRENTLY on PostgreSQL, InnoDB's online build on MariaDB, as in 0005.
AddIndexConcurrentlyOnPostgres = import_module(
    "django_idempotent_tasks.migrations.0005_admin_indexes"
).AddIndexConcurrentlyOnPostgres


class Migration(migrations.Migration):
    # CREATE INDEX CONCURRENTLY cannot run inside a transaction.
    atomic = False

    dependencies = [
        ("django_idempotent_tasks", "0006_outbox"),
    ]

    operations = [
        AddIndexConcurrentlyOnPostgres(
            model_name="idempotencyrecord",
            index=django_idempotent_tasks.models.PostgresPartialIndex(
                fields=["status", "task_name", "created_at"],
                name="django_idempotent_pending_idx",
                where=django.db.models.Q(("status", "PENDING")),
            ),
        ),
    ]
