"""Keys are compared exactly on every database: case, accents and trailing spaces make other keys."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.core import checks
from django.core.management import call_command
from django.db import connection

from django_idempotent_tasks import purging, store
from django_idempotent_tasks.admin.changelist import search_condition
from django_idempotent_tasks.checks import check_key_collation
from django_idempotent_tasks.fields import MARIADB_COLLATION, MYSQL_COLLATION, ExactCharField, exact_collation
from django_idempotent_tasks.models import IdempotencyRecord
from tests import records
from tests.running import run_task
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)

# Each pair is one key under MySQL's and MariaDB's default collation (utf8mb4_general_ci), and
# the last one under their binary PAD SPACE collation (utf8mb4_bin) as well.
NEAR_KEYS = ["re-x-A", "re-x-a", "re-x-é", "re-x-e", "re-x-e "]
TABLE = IdempotencyRecord._meta.db_table
on_mysql = pytest.mark.skipif(connection.vendor != "mysql", reason="a MySQL/MariaDB collation")


def test_keys_differing_in_case_accents_or_trailing_space_run_apart() -> None:
    results = [run_task(tasks.charge_order, n, amount=n, key=key) for n, key in enumerate(NEAR_KEYS)]
    assert [result["value"] for result in results] == list(range(len(NEAR_KEYS)))
    assert sorted(IdempotencyRecord.objects.values_list("key", flat=True)) == sorted(NEAR_KEYS)
    # A replay of each key returns its own result, not a neighbour's.
    replays = [run_task(tasks.charge_order, n, amount=n, key=key) for n, key in enumerate(NEAR_KEYS)]
    assert [replay["value"] for replay in replays] == list(range(len(NEAR_KEYS)))


def test_lookup_claim_and_purge_tell_near_keys_apart() -> None:
    for key in NEAR_KEYS:
        claim = store.insert(
            "s",
            key,
            task_name="t",
            fingerprint=key,
            task_id="id",
            worker="w",
            lease_seconds=60,
            record_ttl=60,
        )
        assert claim is not None, key
    assert [getattr(store.lookup("s", key), "fingerprint", None) for key in NEAR_KEYS] == NEAR_KEYS
    assert (
        store.insert(
            "s",
            "re-x-A",
            task_name="t",
            fingerprint="x",
            task_id="id",
            worker="w",
            lease_seconds=60,
            record_ttl=60,
        )
        is None
    )
    doomed = IdempotencyRecord.objects.filter(scope="s", key="re-x-e")
    assert purging.purge(doomed, batch_size=10) == 0  # live leases are never purged
    IdempotencyRecord.objects.update(lease_expires_at=None, status=IdempotencyRecord.Status.FAILED)
    assert purging.purge(doomed, batch_size=10) == 1
    assert sorted(IdempotencyRecord.objects.values_list("key", flat=True)) == sorted(
        set(NEAR_KEYS) - {"re-x-e"}
    )


def test_admin_search_matches_the_exact_key_and_an_exact_prefix() -> None:
    for key in NEAR_KEYS:
        records.make(key)
    found = IdempotencyRecord.objects.filter
    assert list(found(search_condition("re-x-A")).values_list("key", flat=True)) == ["re-x-A"]
    assert list(found(search_condition("s:re-x-e")).values_list("key", flat=True)) == ["re-x-e"]
    assert sorted(found(search_condition("re-x-e*")).values_list("key", flat=True)) == ["re-x-e", "re-x-e "]
    # SQLite's LIKE ignores ASCII case: the prefix search must not.
    assert list(found(search_condition("RE-X-*")).values_list("key", flat=True)) == []


@pytest.fixture
def column_collation() -> Iterator[Any]:
    """Set the key column's collation for a test; the migrated one comes back afterwards."""
    quote = connection.ops.quote_name

    def alter(collation: str) -> None:
        with connection.cursor() as cursor:
            cursor.execute(
                f"ALTER TABLE {quote(TABLE)} MODIFY {quote('key')} varchar(255) NOT NULL COLLATE {collation}"
            )

    yield alter
    alter(str(exact_collation(connection)))


def e004(collation: str) -> checks.Error:
    return checks.Error(
        f"The 'key' column of {TABLE} (database 'default') has the collation {collation}, which treats keys "
        "differing only in case, accents or trailing spaces as one key: one task's key would replay or "
        "refuse another's.",
        hint="Run the migrations of django_idempotent_tasks (0002 sets a binary NO PAD collation), or ALTER "
        "the column back to utf8mb4_nopad_bin (MariaDB) or utf8mb4_0900_bin (MySQL).",
        id="django_idempotent_tasks.E004",
    )


def test_e004_passes_the_migrated_table() -> None:
    assert check_key_collation(databases=["default"]) == []
    assert check_key_collation(databases=None) == []  # a plain `check` does not touch the database


@on_mysql
@pytest.mark.parametrize("collation", ["utf8mb4_general_ci", "utf8mb4_bin", "utf8mb4_unicode_ci"])
def test_e004_a_key_column_whose_collation_folds_keys(column_collation: Any, collation: str) -> None:
    column_collation(collation)
    assert check_key_collation(databases=["default"]) == [e004(collation)]


@on_mysql
def test_the_migrated_columns_are_binary_and_no_pad() -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT COLUMN_NAME, COLLATION_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() "
            "AND TABLE_NAME = %s AND COLUMN_NAME IN ('scope', 'key') ORDER BY COLUMN_NAME",
            [TABLE],
        )
        assert cursor.fetchall() == (
            ("key", exact_collation(connection)),
            ("scope", exact_collation(connection)),
        )


def test_0002_migrates_back_to_folding_columns_and_forward_to_exact_ones() -> None:
    call_command("migrate", "django_idempotent_tasks", "0001", verbosity=0)
    try:
        before = {error.id for error in check_key_collation(databases=["default"])}
    finally:
        call_command("migrate", "django_idempotent_tasks", verbosity=0)
    # PostgreSQL and SQLite compare exactly with or without 0002; MySQL's default collation folds.
    assert before == ({"django_idempotent_tasks.E004"} if connection.vendor == "mysql" else set())
    assert check_key_collation(databases=["default"]) == []


def test_the_exact_collation_is_the_vendors_own_and_an_explicit_one_wins() -> None:
    mariadb = getattr(connection, "mysql_is_mariadb", False)
    expected = {"mysql": MARIADB_COLLATION if mariadb else MYSQL_COLLATION}.get(connection.vendor)
    assert exact_collation(connection) == expected  # None: PostgreSQL and SQLite compare exactly
    field = ExactCharField(max_length=10, db_collation="C")
    assert field.db_parameters(connection)["collation"] == "C"
