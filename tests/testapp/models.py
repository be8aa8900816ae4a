from __future__ import annotations

from django.db import models


class Effect(models.Model):
    """One execution of a test task's body: the side effect the guarantee is about."""

    key = models.CharField(max_length=255)
    task = models.CharField(max_length=255)
    pid = models.IntegerField()
    fence = models.IntegerField(default=0)
    recovered = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.task}:{self.key}"
