"""Reading the records admin's pages in tests: their queries and the keys they list."""

from __future__ import annotations

import re

from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext


def queries_of(client: Client, url: str) -> tuple[str, list[str]]:
    """The page and its queries, without the savepoints some Django versions wrap views in."""
    with CaptureQueriesContext(connection) as captured:
        html = client.get(url).content.decode()
    sql = [q["sql"] for q in captured.captured_queries]
    return html, [q for q in sql if not q.startswith(("SAVEPOINT", "RELEASE SAVEPOINT"))]


def listed_keys(html: str) -> list[str]:
    return re.findall(r'<span title="([^"]*)" style="white-space:nowrap">', html)
