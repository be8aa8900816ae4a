"""Settings of the chaos workers: the test settings with a short visibility timeout and fast restores."""

from __future__ import annotations

from tests.settings import *  # noqa: F403

# A lost worker's unacked messages come back after VISIBILITY_TIMEOUT s, checked every second
# (kombu's defaults scan every ~100 s, which would dwarf every fault).
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "visibility_timeout": 25,
    "unacked_restore_interval": 1,
    "unacked_restore_throttle": 1,
    # A main process SIGKILLed while it holds kombu's restore mutex would block every restore
    # for the default 300 s.
    "unacked_mutex_expire": 5,
}
CELERY_WORKER_CANCEL_LONG_RUNNING_TASKS_ON_CONNECTION_LOSS = True
# A hard limit below the visibility timeout: no task can hang a child for good.
CELERY_TASK_TIME_LIMIT = 20
