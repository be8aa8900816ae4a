"""Settings of the chaos suite's skewed-clock workers (libfaketime, 300 s off)."""

from __future__ import annotations

from tests.chaosapp.settings import *  # noqa: F403
from tests.chaosapp.settings import CELERY_BROKER_TRANSPORT_OPTIONS

# kombu judges an unacked message's age on the restoring worker's clock: a worker 300 s ahead would
# otherwise see every in-flight message as 300 s old and restore them all, every second.
CELERY_BROKER_TRANSPORT_OPTIONS = {**CELERY_BROKER_TRANSPORT_OPTIONS, "visibility_timeout": 3600}
