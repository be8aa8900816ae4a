"""Several databases: with reads routed to a replica, every read and write of records uses the write database."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.contrib.auth.models import User
from django.core import checks
from django.core.management import call_command
from django.test import Client, override_settings
from django.urls import reverse

from django_idempotent_tasks import store
from django_idempotent_tasks.checks import check_record_databases
from django_idempotent_tasks.models import IdempotencyRecord
from django_idempotent_tasks.tasks import purge_expired_records
from tests import records
from tests.testapp import tasks

# The replica is a database of its own that never receives records: whatever reads it finds nothing.
pytestmark = pytest.mark.django_db(databases=["default", "replica"])
CHANGELIST = reverse("admin:django_idempotent_tasks_idempotencyrecord_changelist")
PURGE = reverse("admin:django_idempotent_tasks_idempotencyrecord_purge")


@pytest.fixture(autouse=True)
def replica_reads() -> Iterator[None]:
    with override_settings(DATABASE_ROUTERS=["tests.routers.ReplicaRouter"]):
        yield


def on(alias: str) -> list[str]:
    return sorted(IdempotencyRecord.objects.using(alias).values_list("key", flat=True))


@pytest.fixture
def admin_client_() -> Client:
    client = Client()
    client.force_login(User.objects.create_superuser("root", "root@example.com", None))
    return client


def test_deliveries_claim_complete_and_replay_on_the_write_database() -> None:
    first = tasks.charge_order.apply((1,), {"idempotency_key": "routed"}).get()
    assert on("default") == ["routed"] and on("replica") == []
    assert store.lookup(tasks.charge_order.name, "routed") is not None
    assert tasks.charge_order.apply((1,), {"idempotency_key": "routed"}).get() == first  # a replay


def test_the_admin_lists_deletes_purges_and_releases_on_the_write_database(admin_client_: Client) -> None:
    scene = records.operator_scene()
    html = admin_client_.get(CHANGELIST).content.decode()
    assert scene["succeeded"].key in html and "7 idempotency records" in html
    assert (
        admin_client_.get(f"{CHANGELIST}?q={scene['failed'].key}")
        .content.decode()
        .count("receipt-order-1002")
        >= 1
    )
    detail = reverse("admin:django_idempotent_tasks_idempotencyrecord_change", args=[scene["result"].pk])
    assert "ch_3PqX9" in admin_client_.get(detail).content.decode()
    admin_client_.post(
        CHANGELIST, {"action": "release_stuck_leases", "_selected_action": [scene["stuck"].pk]}
    )
    assert IdempotencyRecord.objects.using("default").get(pk=scene["stuck"].pk).status == "FAILED"
    confirm = {"action": "delete_selected", "_selected_action": [scene["failed"].pk], "post": "yes"}
    admin_client_.post(CHANGELIST, confirm)
    admin_client_.post(PURGE, {"post": "yes"})
    assert scene["failed"].key not in on("default") and scene["expired"].key not in on("default")
    assert len(on("default")) == len(scene) - 2


def test_the_commands_and_the_periodic_task_purge_the_write_database() -> None:
    records.expired("old-1")
    records.expired("old-2")
    records.make("kept")
    call_command("purge_idempotency_records", "--dry-run", verbosity=0)
    assert on("default") == ["kept", "old-1", "old-2"]
    call_command("purge_idempotency_records", verbosity=0)
    assert on("default") == ["kept"]
    records.expired("old-3")
    assert purge_expired_records.apply().get() == 1
    assert on("default") == ["kept"]


def test_w008_reads_routed_elsewhere_than_writes() -> None:
    assert check_record_databases() == [
        checks.Warning(
            "The database routers read idempotency records from 'replica' but write them to 'default'. "
            "Deliveries, the admin and the commands use 'default' for both: a replica lagging behind would "
            "answer that a finished key never ran.",
            hint="Nothing to do if that is what you want; route django_idempotent_tasks to one database to "
            "silence this.",
            id="django_idempotent_tasks.W008",
        )
    ]
    with override_settings(DATABASE_ROUTERS=[]):
        assert check_record_databases() == []
