"""The query shapes that keep the admin and the commands fast on a large table (issue #29)."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_idempotent_tasks import purging, store
from django_idempotent_tasks.admin.changelist import EstimatedCountPaginator
from django_idempotent_tasks.management import key_state
from django_idempotent_tasks.models import IdempotencyRecord
from tests import records
from tests.admin_pages import listed_keys, queries_of
from tests.running import run_command

pytestmark = pytest.mark.django_db
CHANGELIST = reverse("admin:django_idempotent_tasks_idempotencyrecord_changelist")
TABLE = IdempotencyRecord._meta.db_table


@pytest.fixture
def superuser() -> Client:
    client = Client()
    client.force_login(User.objects.create_superuser("root", "root@example.com", None))
    client.get(CHANGELIST)  # fills Django's content type cache
    return client


def test_scopes_are_listed_from_the_index_in_order() -> None:
    for scope in ("b", "a", "c", "a "):
        records.make(f"k-{scope}", scope=scope)
    records.make("k-a2", scope="a")
    with CaptureQueriesContext(connection) as captured:
        assert store.records().scopes(3) == ["a", "a ", "b"]
    assert len(captured) == 1
    if connection.vendor == "mysql":
        # The recursive walk reads the whole index at every step on MariaDB.
        assert "GROUP BY" in captured[0]["sql"] and "RECURSIVE" not in captured[0]["sql"]
    assert store.records().scopes(10) == ["a", "a ", "b", "c"]


def test_a_key_without_its_scope_is_looked_up_in_every_scope_by_name() -> None:
    records.make("order-1", scope="s1")
    records.make("order-1", scope="s2")
    records.make("order-2", scope="s3")
    with CaptureQueriesContext(connection) as captured:
        found = key_state.find_record("order-2", None)
    assert found == IdempotencyRecord.objects.get(key="order-2")
    assert len(captured) == 2
    lookup = captured[1]["sql"]
    assert re.search(r"scope.? IN \(", lookup), lookup
    with pytest.raises(Exception, match="several scopes \\('s1', 's2'\\)"):
        key_state.find_record("order-1", None)
    assert store.records().with_key("order-1", scopes=["s2"]).get().scope == "s2"
    assert list(store.records().with_key("order-1", scopes=["s3"])) == []
    assert store.records().with_key("order-1", scopes=["x"] * 1000).count() == 2  # too many to name


@pytest.mark.parametrize(
    ("term", "expected"),
    [
        ("*charge-10*", ["order-charge-101", "order-charge-100"]),
        ("*CHARGE*", ["ORDER-CHARGE-1"]),
        ("*e-1*", ["order-charge-101", "order-charge-100"]),
        ("*order-charge-100", ["order-charge-100"]),
        ("*%*", ["100%"]),
        ("order-charge-10*", ["order-charge-101", "order-charge-100"]),
        ("ORDER*", ["ORDER-CHARGE-1"]),
        ("order-charge-10\U0010ffff*", []),
        ("100*", ["100%"]),
        ("shop.tasks.s*", ["order-charge-101"]),
        ("abc1*", ["order-charge-100"]),
    ],
)
def test_contains_and_prefix_searches_are_exact_about_case(
    superuser: Client, term: str, expected: list[str]
) -> None:
    records.make("order-charge-100", task_id="abc123")
    records.make("order-charge-101", task_name="shop.tasks.send", scope="shop")
    records.make("ORDER-CHARGE-1")
    records.make("100%")
    html = superuser.get(CHANGELIST, {"q": term}).content.decode()
    assert listed_keys(html) == expected


def test_the_prefix_search_names_the_scopes(superuser: Client) -> None:
    records.make("order-charge-100", scope="s1")
    html, queries = queries_of(superuser, f"{CHANGELIST}?q=order-charge*")
    assert listed_keys(html) == ["order-charge-100"]
    page = next(q for q in queries if "order-charge" in q and "COUNT" not in q)
    assert re.search(r"scope.? IN \(", page), page
    # A prefix that cannot begin a task id or a task name leaves those unindexed columns alone.
    assert "task_id" not in page.split("WHERE", 1)[1] and "task_name" not in page.split("WHERE", 1)[1]


@pytest.mark.parametrize("query", ["status__exact=FAILED", "stuck=yes", "q=k-1", "q=k-*"])
def test_filtered_page_query_count_does_not_grow_with_rows(superuser: Client, query: str) -> None:
    records.failed("k-1")
    records.stuck("k-2")
    _, few = queries_of(superuser, f"{CHANGELIST}?{query}")
    # session, user, scopes of the filter, (scopes of the search), bounded COUNT, the page, the
    # date hierarchy's two ends
    assert len(few) == (8 if query.startswith("q=") else 7), few
    for n in range(30):
        records.failed(f"k-1{n}", scope=f"scope-{n}")
        records.stuck(f"k-2{n}")
    _, many = queries_of(superuser, f"{CHANGELIST}?{query}")
    assert len(many) == len(few), many


# ANALYZE TABLE commits on MySQL: the test cannot run inside a transaction.
@pytest.mark.django_db(transaction=True)
def test_a_filter_matching_more_than_the_threshold_shows_the_planners_estimate(
    superuser: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    for n in range(30):
        records.make(f"many-{n}")
    records.failed("k-1")
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE TABLE {TABLE}" if connection.vendor == "mysql" else f"ANALYZE {TABLE}")
        if connection.vendor == "mysql":
            cursor.fetchall()
    monkeypatch.setattr(EstimatedCountPaginator, "estimate_above", 10)
    html, queries = queries_of(superuser, f"{CHANGELIST}?status__exact=SUCCEEDED")
    if connection.vendor == "sqlite":  # no estimate to offer: it counts
        assert re.findall(r"\d+ idempotency records", html) == ["30 idempotency records"]
        return
    shown = re.findall(r"about (\d+) idempotency records \(the database's estimate\)", html)
    assert len(shown) == 1 and int(shown[0]) >= 11, shown  # never fewer than the bounded count found
    assert any(q.startswith("EXPLAIN") for q in queries)
    assert "1 idempotency record" in superuser.get(f"{CHANGELIST}?status__exact=FAILED").content.decode()


def test_the_purge_walks_the_expiry_index_and_stops_after_a_short_batch(
    django_assert_num_queries: Any,
) -> None:
    # Ids in the opposite order of expiry: a walk by primary key would read them all per batch.
    for n in range(5):
        records.expired(f"old-{n}", expires_at=records.PAST - timedelta(days=n))
    records.make("fresh")
    # by expiry: a full batch, a short one (the last), then the records without an expiry
    with CaptureQueriesContext(connection) as captured:
        assert purging.purge(store.records().expired(), batch_size=3) == 5
    # the third record by expiry, the DELETE up to it, no sixth record so the DELETE of the rest,
    # then the same two for the records without expiry
    assert len(captured) == 6, captured
    select = captured[0]["sql"]
    assert select.startswith(
        'SELECT "django_idempotent_tasks_idempotencyrecord"."expires_at"'.replace(
            '"', connection.ops.quote_name("x")[0]
        )
    )
    # By expiry, then primary key: Django 5+ names the selected columns by position, 4.2 by name.
    by_name = "ORDER BY {0}.{1}expires_at{1} ASC, {0}.{1}id{1} ASC LIMIT 1 OFFSET 2".format(
        connection.ops.quote_name("django_idempotent_tasks_idempotencyrecord"),
        connection.ops.quote_name("x")[0],
    )
    assert select.endswith(("ORDER BY 1 ASC, 2 ASC LIMIT 1 OFFSET 2", by_name)), select
    # The DELETE names the range of the index up to that record, not a list of primary keys.
    delete = captured[1]["sql"]
    assert delete.startswith("DELETE") and " IN (" not in delete, delete
    assert records.keys() == ["fresh"]
    records.make("no-expiry", expires_at=None, created_at=records.PAST)
    assert purging.purge(store.records().filter(created_at__lt=records.FUTURE), batch_size=1) == 2
    assert records.keys() == []


def test_records_sharing_one_expiry_are_purged_by_seeking_past_the_last_one_deleted() -> None:
    # A bulk UPDATE or a burst of deliveries in one second: the walk's batches end inside the tie.
    for n in range(5):
        records.expired(f"tied-{n}", expires_at=records.PAST)
    with CaptureQueriesContext(connection) as captured:
        assert purging.purge(store.records().expired(), batch_size=2) == 5
    assert records.keys() == []
    after_first = captured[2]["sql"]  # the second batch's SELECT, after the first batch's last record
    assert after_first.startswith("SELECT"), captured
    if connection.vendor not in ("postgresql", "sqlite"):  # MariaDB seeks to the OR form instead
        assert " OR " in after_first and ") > (" not in after_first, after_first
        return
    # PostgreSQL and SQLite: "(expires_at, id) > (…)", a range of the (expires_at, id) index. With
    # "expires_at > e OR (expires_at = e AND id > p)" PostgreSQL read and sorted every record of
    # the tie at every batch: 14,061 rows/s for 100,000 sharing one expiry.
    assert ") > (" in after_first and " OR " not in after_first, after_first
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            # As on a large table: the index, not a scan of a few rows (a plan that needs a Sort
            # keeps it whatever these say).
            cursor.execute("SET LOCAL enable_seqscan = off; SET LOCAL enable_bitmapscan = off")
            cursor.execute(f"EXPLAIN {after_first}")
            plan = "\n".join(row[0] for row in cursor.fetchall())
        assert "django_idempotent_expiry_idx" in plan and "Sort" not in plan, plan


def test_a_purge_across_ties_and_microseconds_deletes_batch_by_batch_each_record_once() -> None:
    # Ids against expiry order around a tie, expiries a microsecond apart: every bound of the walk
    # falls on a tie, on its edge or past it.
    tick = timedelta(microseconds=1)
    for key in ("later-a", "later-b"):
        records.expired(key, expires_at=records.PAST + tick)
    for n in range(3):
        records.expired(f"tied-{n}", expires_at=records.PAST)
    records.expired("earlier", expires_at=records.PAST - tick)
    records.make("fresh")
    progress: list[int] = []
    assert purging.purge(store.records().expired(), batch_size=2, progress=progress.append) == 6
    assert progress == [2, 4, 6]  # whole batches, none skipped or deleted twice
    assert records.keys() == ["fresh"]


def index_definitions() -> dict[str, Any]:
    with connection.cursor() as cursor:
        return dict(connection.introspection.get_constraints(cursor, TABLE))


def test_the_admin_indexes_exist_and_the_status_ones_are_partial_on_postgresql() -> None:
    indexes = index_definitions()
    assert indexes["django_idempotent_expiry_idx"]["columns"] == ["expires_at", "id"]
    assert "django_idempotent_expires_idx" not in indexes  # replaced by it (migration 0008)
    assert indexes["django_idempotent_status_idx"]["columns"] == ["status", "id"]
    assert indexes["django_idempotent_created_idx"]["columns"] == ["created_at"]
    assert indexes["django_idempotent_pending_idx"]["columns"] == ["status", "task_name", "created_at"]
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_get_indexdef('django_idempotent_status_idx'::regclass)")
            definition = cursor.fetchone()[0]
            cursor.execute("SELECT pg_get_indexdef('django_idempotent_pending_idx'::regclass)")
            pending = cursor.fetchone()[0]
        assert "WHERE" in definition and "FAILED" in definition and "IN_PROGRESS" in definition
        assert "WHERE" in pending and "PENDING" in pending and "FAILED" not in pending


def test_the_purge_keeps_pending_records_and_the_status_command_does_not_count_them() -> None:
    records.expired("old-pending", "PENDING")
    records.expired("old-done", expires_at=records.PAST + timedelta(days=1))
    records.make("pending-without-expiry", "PENDING", expires_at=None, created_at=records.PAST)
    assert key_state.expired_summary() == {"n": 1, "oldest": records.PAST + timedelta(days=1)}
    assert purging.purge(store.records().expired(), batch_size=1) == 1
    assert purging.purge(store.records().filter(created_at__lt=records.FUTURE), batch_size=1) == 0
    assert records.keys() == ["old-pending", "pending-without-expiry"]
    assert key_state.expired_summary() == {"n": 0, "oldest": None}


def test_the_status_command_counts_by_status_first_then_lists_tasks_in_order() -> None:
    records.make("a", task_name="t2")
    records.make("b", "FAILED", task_name="t1")
    records.make("c", "PENDING", task_name="t1")
    with CaptureQueriesContext(connection) as captured:
        output = run_command("idempotency_status")
    assert output.index("  t1: 2") < output.index("  t2: 1"), output
    grouped = next(q["sql"] for q in captured if "GROUP BY" in q["sql"])
    # The order of the (status, task_name, created_at) index: MariaDB and SQLite stream through it.
    # (Django 5 aliases the selected columns and groups by their positions, 4.2 by their names.)
    assert re.match(r"SELECT \S*status\W*( AS \W*status\W*)?, \S*task_name", grouped), grouped
    assert re.search(r"GROUP BY (1, 2|\S*status\S*, \S*task_name)", grouped), grouped


@pytest.mark.parametrize("status", ["PENDING", "FAILED"])
def test_the_pending_and_failed_filters_list_newest_first_in_seven_queries(
    superuser: Client, status: str
) -> None:
    for n in range(3):
        records.make(f"{status.lower()}-{n}", status)
    records.make("done")
    html, queries = queries_of(superuser, f"{CHANGELIST}?status__exact={status}")
    assert listed_keys(html) == [f"{status.lower()}-{n}" for n in (2, 1, 0)]
    assert len(queries) == 7, queries


def test_a_day_is_listed_newest_first_through_the_created_at_index(superuser: Client) -> None:
    made = [records.make(f"day-{n}") for n in range(3)]
    created = made[0].created_at
    day = {
        "created_at__year": created.year,
        "created_at__month": created.month,
        "created_at__day": created.day,
    }
    html, queries = queries_of(superuser, f"{CHANGELIST}?{'&'.join(f'{k}={v}' for k, v in day.items())}")
    assert listed_keys(html) == ["day-2", "day-1", "day-0"]
    page = next(q for q in queries if "created_at" in q and "COUNT" not in q and "LIMIT 1" not in q)
    assert re.search(r"ORDER BY \(\S+id\W* \+ 0\) DESC", page), page


def test_an_exact_search_is_sorted_after_the_index_finds_it(superuser: Client) -> None:
    records.make("order-1", scope="s1")
    records.make("order-2", scope="s2")
    html, queries = queries_of(superuser, f"{CHANGELIST}?q=order-1")
    assert listed_keys(html) == ["order-1"]
    page = next(q for q in queries if "order-1" in q and "COUNT" not in q)
    # Not the primary key walked down with the search as a filter (SQLite did that: 0.5 s).
    assert re.search(r"ORDER BY \(\S+id\W* \+ 0\) DESC", page), page
