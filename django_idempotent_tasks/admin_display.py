"""HTML of the records admin's columns and detail fields: badges, the lease, JSON, errors."""

from __future__ import annotations

import json
import logging
from datetime import datetime
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.utils import formats, timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.translation import gettext

from django_idempotent_tasks import keys, locks
from django_idempotent_tasks.models import IdempotencyRecord

logger = logging.getLogger("django_idempotent_tasks")
KEY_DISPLAY_LENGTH = 40
_BADGE_COLOURS = {"succeeded": "#2e7d32", "failed": "#c62828", "in_progress": "#1565c0", "stuck": "#ef6c00"}


def short_key(key: str) -> SafeString:
    """The key cut to ``KEY_DISPLAY_LENGTH`` characters, the full key on hover."""
    shown = key if len(key) <= KEY_DISPLAY_LENGTH else f"{key[: KEY_DISPLAY_LENGTH - 1]}…"
    return format_html('<span title="{}" style="white-space:nowrap">{}</span>', key, shown)


def status_badge(record: IdempotencyRecord) -> SafeString:
    """The status as a coloured badge; "Stuck" for IN_PROGRESS with an expired lease."""
    kind, label = record.status.lower(), record.get_status_display()
    if record.is_stuck:
        kind, label = "stuck", gettext("Stuck")
    return format_html(
        '<span class="idempotency-status idempotency-status-{}" style="background:{};color:#fff;'
        'padding:1px 8px;border-radius:8px;white-space:nowrap">{}</span>',
        kind,
        _BADGE_COLOURS[kind],
        label,
    )


def _when(moment: datetime | None) -> str:
    return formats.localize(timezone.localtime(moment)) if moment else "-"


def lease_table(record: IdempotencyRecord) -> SafeString:
    """Worker, task id, lease expiry and whether the lease is live, as a small table."""
    if record.status != IdempotencyRecord.Status.IN_PROGRESS:
        state = gettext("none: the record is %(status)s") % {"status": record.get_status_display()}
    elif record.lease_is_live:
        state = gettext("live")
    else:
        state = gettext("expired: the holder died or stalled")
    rows = [
        (gettext("worker"), record.worker or "-"),
        (gettext("task id"), record.task_id or "-"),
        (gettext("lease expires at"), _when(record.lease_expires_at)),
        (gettext("lease"), state),
    ]
    return format_html(
        '<table class="idempotency-lease">{}</table>',
        format_html_join("", "<tr><th>{}</th><td>{}</td></tr>", rows),
    )


def lock_state(record: IdempotencyRecord) -> str:
    """Who holds the record's Redis lock now, said in words; "unknown" if Redis does not answer."""
    try:
        token = locks.lock_holder(locks.lock_client(), keys.lock_name(record.scope, record.key))
    except Exception:  # the page must render whatever the lock cache does
        logger.warning("Could not read the lock of %s from Redis.", keys.loggable(record.key), exc_info=True)
        return gettext("unknown (Redis did not answer)")
    if token is None:
        return gettext("not held")
    # A token is "<host>:<pid>:<random>": the random part says nothing to a reader.
    return gettext("held by %(holder)s") % {"holder": token.rsplit(":", 1)[0]}


def pretty_json(value: Any) -> SafeString:
    """JSON indented and sorted, in a <pre>."""
    text = json.dumps(value, cls=DjangoJSONEncoder, indent=2, sort_keys=True, ensure_ascii=False)
    return format_html("<pre>{}</pre>", text)


def error_details(error: Any) -> SafeString | str:
    """The stored error: type and message, then the traceback in a <pre>."""
    if not error:
        return "-"
    error = error if isinstance(error, dict) else {"message": error}
    return format_html(
        "<strong>{}</strong>: {}<pre>{}</pre>",
        error.get("type", ""),
        error.get("message", ""),
        error.get("traceback", ""),
    )
