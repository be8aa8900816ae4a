from typing import Any

from django.db import migrations

import django_idempotent_tasks.fields


class AlterFieldOnMySQL(migrations.AlterField):
    """AlterField whose schema change runs on MySQL and MariaDB only (the binary collation).

    PostgreSQL and SQLite already compare keys exactly: their columns stay as they are, so SQLite
    does not copy the whole table to change nothing.
    """

    def database_forwards(self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any) -> None:
        if schema_editor.connection.vendor == "mysql":
            super().database_forwards(app_label, schema_editor, from_state, to_state)

    def database_backwards(self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any) -> None:
        if schema_editor.connection.vendor == "mysql":
            super().database_backwards(app_label, schema_editor, from_state, to_state)


class Migration(migrations.Migration):
    dependencies = [
        ("django_idempotent_tasks", "0001_initial"),
    ]

    operations = [
        AlterFieldOnMySQL(
            model_name="idempotencyrecord",
            name="scope",
            field=django_idempotent_tasks.fields.ExactCharField(
                help_text="Namespace of the key; the task name by default.",
                max_length=255,
                verbose_name="scope",
            ),
        ),
        AlterFieldOnMySQL(
            model_name="idempotencyrecord",
            name="key",
            field=django_idempotent_tasks.fields.ExactCharField(
                help_text="The idempotency key the caller chose.", max_length=255, verbose_name="key"
            ),
        ),
    ]
