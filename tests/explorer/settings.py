"""Settings of the explorer's worker: the chaos settings, with the harness as the only redeliverer."""

from __future__ import annotations

from tests.chaosapp.settings import *  # noqa: F403

# The harness redelivers every struck message itself, as the broker would: a main process killed
# with a message unacked must not see it restored by kombu in the middle of a later cell.
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 3600}
CELERY_TASK_TIME_LIMIT = 30
