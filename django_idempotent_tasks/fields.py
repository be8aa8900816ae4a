"""The column type of scopes and keys: compared byte for byte on every database."""

from __future__ import annotations

from typing import Any

from django.db import models
from django.db.backends.base.base import BaseDatabaseWrapper

#: Binary and NO PAD: MySQL's and MariaDB's default collations fold case and accents, and their
#: PAD SPACE collations (utf8mb4_bin included) ignore trailing spaces, so "a", "A" and "a " would
#: be one key. PostgreSQL's and SQLite's default comparisons are already exact.
MARIADB_COLLATION = "utf8mb4_nopad_bin"
MYSQL_COLLATION = "utf8mb4_0900_bin"


def exact_collation(connection: BaseDatabaseWrapper) -> str | None:
    """The collation that compares keys exactly on ``connection``, or None where the default does."""
    if connection.vendor != "mysql":
        return None
    return MARIADB_COLLATION if getattr(connection, "mysql_is_mariadb", False) else MYSQL_COLLATION


class ExactCharField(models.CharField):  # type: ignore[type-arg]
    """A CharField whose equality and uniqueness are exact: case, accents and trailing spaces count."""

    def db_parameters(self, connection: BaseDatabaseWrapper) -> dict[str, Any]:
        params = super().db_parameters(connection)
        # Chosen per connection rather than stored as db_collation: one value cannot suit every vendor.
        if self.db_collation is None:
            params["collation"] = exact_collation(connection)
        return params
