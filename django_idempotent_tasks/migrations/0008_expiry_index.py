from __future__ import annotations

from importlib import import_module
from typing import Any

import django.db.models
from django.db import migrations

# CREATE INDEX CONCURRENTLY on PostgreSQL, InnoDB's online build on MariaDB, as in 0005.
AddIndexConcurrentlyOnPostgres = import_module(
    "django_idempotent_tasks.migrations.0005_admin_indexes"
).AddIndexConcurrentlyOnPostgres


class RemoveIndexConcurrentlyOnPostgres(migrations.RemoveIndex):
    """RemoveIndex, dropped by RemoveIndexConcurrently on PostgreSQL so that claims go on meanwhile."""

    def database_forwards(self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any) -> None:
        if schema_editor.connection.vendor == "postgresql":
            from django.contrib.postgres.operations import RemoveIndexConcurrently

            operation = RemoveIndexConcurrently(self.model_name, self.name)
            operation.database_forwards(app_label, schema_editor, from_state, to_state)
        else:
            super().database_forwards(app_label, schema_editor, from_state, to_state)

    def database_backwards(self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any) -> None:
        if schema_editor.connection.vendor == "postgresql":
            from django.contrib.postgres.operations import RemoveIndexConcurrently

            operation = RemoveIndexConcurrently(self.model_name, self.name)
            operation.database_backwards(app_label, schema_editor, from_state, to_state)
        else:
            super().database_backwards(app_label, schema_editor, from_state, to_state)


class Migration(migrations.Migration):
    # CREATE and DROP INDEX CONCURRENTLY cannot run inside a transaction.
    atomic = False

    dependencies = [
        ("django_idempotent_tasks", "0007_pending_index"),
    ]

    # The new index first: the status command's expired count and the purge keep an index meanwhile.
    operations = [
        AddIndexConcurrentlyOnPostgres(
            model_name="idempotencyrecord",
            index=django.db.models.Index(fields=["expires_at", "id"], name="django_idempotent_expiry_idx"),
        ),
        RemoveIndexConcurrentlyOnPostgres(
            model_name="idempotencyrecord",
            name="django_idempotent_expires_idx",
        ),
    ]
