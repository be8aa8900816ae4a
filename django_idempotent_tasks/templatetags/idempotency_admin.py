"""Template tags of the records admin: a shim over django_idempotent_tasks.admin.date_hierarchy."""

from __future__ import annotations

from typing import Any

from django import template

from django_idempotent_tasks.admin import date_hierarchy

register = template.Library()


@register.inclusion_tag("admin/date_hierarchy.html")
def record_date_hierarchy(cl: Any) -> dict[str, Any]:
    """Year, month and day links between the oldest and the newest record (empty days included)."""
    return date_hierarchy.hierarchy(cl)
