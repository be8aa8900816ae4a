"""A caller of an outbox task in its own process: ``python -m tests.outbox_caller MODE KEY QUEUE``.

MODE ``killed``: SIGKILLed right after its transaction commits, before the publish runs;
``commit``: one call inside a transaction (the broker may be down: it must still exit 0);
``race``: waits for the control key ``go:KEY``, then 10 threads call at once and print their task ids.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

from django.db import close_old_connections, transaction  # noqa: E402

import tests.celery_app  # noqa: E402, F401  (sets Django up; the tasks send through the test app)
from tests.testapp.faults import control  # noqa: E402
from tests.testapp.tasks import outbox_effect  # noqa: E402


def send(key: str, queue: str) -> str:
    return str(outbox_effect.apply_async((1,), {"idempotency_key": key}, queue=queue).id)


def main(mode: str, key: str, queue: str) -> None:
    if mode == "killed":
        with transaction.atomic():
            # Registered first, so it runs first after the COMMIT: the publish never happens.
            transaction.on_commit(lambda: os.kill(os.getpid(), signal.SIGKILL))
            send(key, queue)
    elif mode == "commit":
        with transaction.atomic():
            print(send(key, queue), flush=True)
    elif mode == "race":
        while not control().get(f"go:{key}"):
            time.sleep(0.001)
        ids: list[str] = []

        def call() -> None:
            try:
                ids.append(send(key, queue))
            finally:
                close_old_connections()

        threads = [threading.Thread(target=call) for _ in range(10)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        print(" ".join(ids), flush=True)


if __name__ == "__main__":
    logging.basicConfig(format="%(levelname)s %(name)s: %(message)s")
    main(*sys.argv[1:4])
