"""The outbox under chaos: a broker that drops a message it accepted, and the re-drive that must
send it again."""

from __future__ import annotations

import contextlib
import io
import json
import threading
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from django.core.management import CommandError, call_command
from django.db import InterfaceError, OperationalError, connections
from kombu.transport import redis as kombu_redis
from kombu.utils.json import dumps

from django_idempotent_tasks.models import IdempotencyRecord
from tests.chaos.plan import Fault, value_of
from tests.chaosapp.tasks import chaos_outbox

if TYPE_CHECKING:
    from tests.chaos.faults import Context

#: A PENDING record is sent again this long after its message (the chaos runs' REDRIVE_AFTER).
REDRIVE_AFTER = 10
#: How often the harness runs the re-drive, as a beat entry would.
REDRIVE_EVERY = 2.0


class BrokerDrops:
    """Messages, by task id, that the Redis broker accepts and then loses before any worker takes them.

    A plain LREM after the publish loses the race to an idle worker's BRPOP, which Redis serves the
    moment the LPUSH lands; LPUSH and LREM in one MULTI leave no moment in which a worker can pop it.
    """

    def __init__(self) -> None:
        self.ids: set[str] = set()
        self.dropped: list[str] = []
        self.mutex = threading.Lock()

    @contextlib.contextmanager
    def installed(self) -> Iterator[BrokerDrops]:
        """Drop the chosen messages while inside (in this process: the harness's sends)."""
        original = kombu_redis.Channel._put
        drops = self

        def put(channel: Any, queue: str, message: dict[str, Any], **kwargs: Any) -> None:
            task_id = str((message.get("headers") or {}).get("id"))
            with drops.mutex:
                drop = task_id in drops.ids
                drops.ids.discard(task_id)  # the first copy only: the re-drive's copy gets through
            if not drop:
                original(channel, queue, message, **kwargs)
                return
            name = channel._q_for_pri(queue, channel._get_message_priority(message, reverse=False))
            payload = dumps(message)
            with channel.conn_or_acquire() as client:
                pipe = client.pipeline(transaction=True)
                pipe.lpush(name, payload)
                pipe.lrem(name, 1, payload)
                _length, removed = pipe.execute()
            assert removed == 1, f"message {task_id} was not in {name} to drop"
            with drops.mutex:
                drops.dropped.append(task_id)

        setattr(kombu_redis.Channel, "_put", put)  # noqa: B010  # a method, patched for the run
        try:
            yield self
        finally:
            setattr(kombu_redis.Channel, "_put", original)  # noqa: B010


def broker_drop(ctx: Context, fault: Fault) -> None:
    """An outbox task's message is accepted by the broker and lost before any worker takes it: its
    record stays PENDING until the re-drive sends it again (then one body, under fence 1)."""
    task_id = str(uuid.uuid4())
    with ctx.drops.mutex:
        ctx.drops.ids.add(task_id)
    ctx.send(chaos_outbox, fault.key, (value_of(fault.key),), task_id=task_id)
    assert task_id in ctx.drops.dropped, f"the message of {fault.key} was not dropped"
    status = IdempotencyRecord.objects.get(key=fault.key).status
    ctx.done("broker_drop", f"{fault.key}: message {task_id} dropped by the broker; the record is {status}")


class Redrive(threading.Thread):
    """``manage.py redrive_idempotency_records``, run every REDRIVE_EVERY s as cron or beat would."""

    def __init__(self, older_than: int = REDRIVE_AFTER) -> None:
        super().__init__(daemon=True, name="chaos-redrive")
        self.older_than = older_than
        self.stopping = threading.Event()
        self.sent: list[str] = []
        self.errors: list[str] = []

    def run(self) -> None:
        while not self.stopping.wait(REDRIVE_EVERY):
            output = io.StringIO()
            try:
                call_command(
                    "redrive_idempotency_records",
                    "--older-than",
                    f"{self.older_than}s",
                    "--json",
                    stdout=output,
                )
            except (OperationalError, InterfaceError, CommandError) as exc:  # the soak restarts PostgreSQL
                self.errors.append(repr(exc))
            else:
                self.sent += [record["task_id"] for record in json.loads(output.getvalue())["records"]]
            finally:
                connections.close_all()

    def stop(self) -> None:
        self.stopping.set()
        self.join(timeout=60)
        assert not self.is_alive(), "the re-drive hung"
