"""Settings of the topology workers: the chaos workers' settings, aimed at a topology by the environment."""

from __future__ import annotations

import json
import os

from tests.chaosapp.settings import *  # noqa: F403
from tests.chaosapp.settings import CACHES, DATABASES
from tests.topologies.config import sentinel_cache

# TOPOLOGIES_DATABASE: JSON merged into DATABASES["default"] (PgBouncer, multi-host, a proxy).
if os.environ.get("TOPOLOGIES_DATABASE"):
    DATABASES = {
        **DATABASES,
        "default": {**DATABASES["default"], **json.loads(os.environ["TOPOLOGIES_DATABASE"])},
    }
# TOPOLOGIES_SENTINELS: the sentinels' ports; the lock cache then goes through Sentinel.
if os.environ.get("TOPOLOGIES_SENTINELS"):
    CACHES = {
        **CACHES,
        "locks": sentinel_cache([int(p) for p in os.environ["TOPOLOGIES_SENTINELS"].split(",")]),
    }
