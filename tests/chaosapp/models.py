from __future__ import annotations

from django.db import models


class ChaosEffect(models.Model):
    """The database side effect of one chaos task body; committed with the completion (atomic mode)."""

    key = models.CharField(max_length=255, db_index=True)
    task = models.CharField(max_length=255)
    pid = models.IntegerField()
    fence = models.IntegerField()
    recovered = models.BooleanField(default=False)

    def __str__(self) -> str:
        return f"{self.task}:{self.key}"
