#!/usr/bin/env python
"""Time the records admin on a large table against a stock ModelAdmin (a throwaway database; not in make test).

    REDIS_URL=redis://127.0.0.1:6379 .venv/bin/python -m benchmarks.admin_timing \
        --database-url postgres://postgres@127.0.0.1:5432/idem_admin_timing --rows 1000000
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import types
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TABLE = "django_idempotent_tasks_idempotencyrecord"
# Twelve tasks; one record in 50 FAILED, one in 2000 stuck and one in 2000 live IN_PROGRESS;
# created over eight days with a seven-day retention, so the oldest eighth is expired.
SEED = f"""
INSERT INTO {TABLE} (scope, key, task_name, status, fingerprint, result, error, steps, attempts, fence,
                     task_id, worker, lease_expires_at, created_at, started_at, completed_at, expires_at)
SELECT 'shop.tasks.task_' || (n %% 12), 'order-charge-' || n, 'shop.tasks.task_' || (n %% 12),
       s.status, md5(n::text) || md5((n + 1)::text),
       CASE WHEN s.status = 'SUCCEEDED' THEN jsonb_build_object('charge_id', 'ch_' || n, 'amount_cents', n) END,
       CASE WHEN s.status = 'FAILED' THEN '{{"type": "Timeout", "message": "gateway timed out", "traceback": ""}}'::jsonb END,
       '{{}}'::jsonb, 1, 1, md5(n::text)::uuid::text, 'worker-' || (n %% 4) || ':' || (1000 + n %% 7),
       CASE WHEN n %% 2000 = 0 THEN now() - interval '1 hour' WHEN n %% 2000 = 1000 THEN now() + interval '1 hour' END,
       t.created, t.created, CASE WHEN s.status <> 'IN_PROGRESS' THEN t.created END, t.created + interval '7 days'
FROM generate_series(1, %(rows)s) AS n,
     LATERAL (SELECT CASE WHEN n %% 1000 = 0 THEN 'IN_PROGRESS' WHEN n %% 50 = 7 THEN 'FAILED'
                          ELSE 'SUCCEEDED' END AS status) AS s,
     LATERAL (SELECT now() - interval '8 days' + (interval '8 days' * n / %(rows)s) AS created) AS t
"""


def setup(database_url: str) -> None:
    import psycopg

    name = urlsplit(database_url).path.lstrip("/")
    server = database_url.rsplit("/", 1)[0] + "/postgres"
    with psycopg.connect(server, autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')
    os.environ["DATABASE_URL"] = database_url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()


def seed(rows: int) -> None:
    from django.core.management import call_command
    from django.db import connection

    call_command("migrate", verbosity=0)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM {TABLE}")
        if cursor.fetchone()[0] != rows:
            print(f"Seeding {rows} records…", flush=True)
            cursor.execute(f"TRUNCATE {TABLE}")
            cursor.execute(SEED, {"rows": rows})
        cursor.execute(f"VACUUM ANALYZE {TABLE}")


def stock_site() -> Any:
    from django.contrib import admin

    from django_idempotent_tasks.models import IdempotencyRecord

    class StockAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
        list_display = (
            "key",
            "scope",
            "status",
            "attempts",
            "fence",
            "created_at",
            "completed_at",
            "expires_at",
        )
        list_filter = ("status", "scope")
        date_hierarchy = "created_at"
        search_fields = ("key", "task_id", "task_name")
        ordering = ("-pk",)
        list_per_page = 50

    site = admin.AdminSite(name="stock")
    site.register(IdempotencyRecord, StockAdmin)
    return site


def measure(client: Any, url: str, runs: int) -> tuple[float, int, float]:
    """Median milliseconds of ``runs`` GETs after one warm-up; queries and slowest query of the last."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    assert client.get(url).status_code == 200, url
    times = []
    for _ in range(runs):
        with CaptureQueriesContext(connection) as queries:
            started = time.perf_counter()
            response = client.get(url)
            times.append((time.perf_counter() - started) * 1000)
        assert response.status_code == 200, url
    slowest = max(float(q["time"]) for q in queries.captured_queries) * 1000
    return statistics.median(times), len(queries.captured_queries), slowest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", default="postgres://postgres@127.0.0.1:5432/idem_admin_timing")
    parser.add_argument("--rows", type=int, default=1_000_000, help="records to create (default: 1000000)")
    parser.add_argument("--runs", type=int, default=5, help="timed requests per page (default: 5)")
    options = parser.parse_args()
    setup(options.database_url)
    seed(options.rows)

    from django.contrib import admin
    from django.contrib.auth.models import User
    from django.test import Client, override_settings
    from django.urls import path
    from django.utils import timezone

    urls = types.ModuleType("admin_timing_urls")
    urls.urlpatterns = [path("admin/", admin.site.urls), path("stock/", stock_site().urls)]  # type: ignore[attr-defined]
    sys.modules[urls.__name__] = urls
    user = User.objects.filter(username="timing").first() or User.objects.create_superuser("timing", "", "x")
    client = Client()
    client.force_login(user)
    now = timezone.now().strftime("%Y-%m-%d %H:%M:%S")
    key = f"order-charge-{options.rows * 7 // 9}"
    deep = options.rows // 50 - 1
    today = timezone.now()
    day = f"created_at__year={today.year}&created_at__month={today.month}&created_at__day={today.day}"
    pages = [
        ("changelist, page 1", "", ""),
        (f"changelist, page {deep}", f"p={deep}", f"p={deep}"),
        ("status = FAILED", "status__exact=FAILED", "status__exact=FAILED"),
        ("task / scope", "scope=shop.tasks.task_5", "scope__exact=shop.tasks.task_5"),
        ("stuck", "stuck=yes", f"status__exact=IN_PROGRESS&lease_expires_at__lt={now}"),
        ("expired", "expired=yes", f"expires_at__lt={now}"),
        ("date hierarchy: one day", day, day),
        ("search: exact key", f"q={key}", f"q={key}"),
        ("search: key prefix", f"q={key[:-2]}*", f"q={key[:-2]}"),
        ("search: scope:key", f"q=shop.tasks.task_{int(key.rsplit('-', 1)[1]) % 12}:{key}", f"q={key}"),
    ]
    print(f"{'page':<28} {'ours ms':>9} {'q':>3} {'slowest':>8} {'stock ms':>9} {'q':>3} {'slowest':>8}")
    with override_settings(ROOT_URLCONF=urls.__name__):
        base = "/{}/django_idempotent_tasks/idempotencyrecord/?{}"
        for label, ours, stock in pages:
            a = measure(client, base.format("admin", ours), options.runs)
            b = measure(client, base.format("stock", stock), options.runs)
            print(
                f"{label:<28} {a[0]:9.0f} {a[1]:3d} {a[2]:8.0f} {b[0]:9.0f} {b[1]:3d} {b[2]:8.0f}", flush=True
            )
        from django_idempotent_tasks.models import IdempotencyRecord

        pk = IdempotencyRecord.objects.get(key=key).pk
        a = measure(client, f"/admin/django_idempotent_tasks/idempotencyrecord/{pk}/change/", options.runs)
        b = measure(client, f"/stock/django_idempotent_tasks/idempotencyrecord/{pk}/change/", options.runs)
        print(f"{'detail page':<28} {a[0]:9.0f} {a[1]:3d} {a[2]:8.0f} {b[0]:9.0f} {b[1]:3d} {b[2]:8.0f}")
        a = measure(client, "/admin/django_idempotent_tasks/idempotencyrecord/purge-expired/", options.runs)
        print(f"{'purge confirmation (count)':<28} {a[0]:9.0f} {a[1]:3d} {a[2]:8.0f}")


if __name__ == "__main__":
    main()
