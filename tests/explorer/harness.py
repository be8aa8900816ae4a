"""The explorer's harness: one instrumented worker, a recording run per kind, one fault per cell."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from celery.utils.nodenames import host_format
from django.conf import settings
from django.db import connection, connections

from django_idempotent_tasks.models import IdempotencyRecord
from tests.chaos.checker import read_answers, text
from tests.chaos.services import LockRedis, kill_group
from tests.explorer import verdict
from tests.explorer.cells import PROXIED, Boundary, Cell
from tests.explorer.proxy import DropProxy
from tests.explorer.tasks import KINDS, LEASE
from tests.helpers import Worker, wait_for
from tests.testapp.faults import control

Status = IdempotencyRecord.Status
# How long a cell may take to reach its boundary, and then to settle (I5: nothing hangs).
REACH_SECONDS = 30
SETTLE_SECONDS = 60
# A settled key's trace must stay still this long: no delivery of it is still under way.
QUIET_SECONDS = 0.5
# How long a paused holder stays stopped at most: past its lease, long enough for the duplicate
# to take the key over (it retries every CONFLICT_RETRY_DELAY s).
PAUSE_SECONDS = 4 * LEASE + 2
PROXY_PORT = int(os.environ.get("EXPLORE_PROXY_PORT", "0"))  # 0: a free port, so two runs can share a machine
APP, QUEUE = "tests.explorer.celery_app", "explore"


@dataclass
class Run:
    """What one cell did: whether its fault struck, what it noted, what the checker found."""

    cell: Cell
    key: str
    struck: bool = False
    applied: bool = True  # False: db_kill or ambiguous_commit found no database connection open
    notes: list[str] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    extra_calls: int = 0
    seconds: float = 0.0

    @property
    def outcome(self) -> str:
        if self.violations:
            return "FAIL"
        if not self.struck:
            return "unreached"
        if not self.applied:
            return "no-conn"
        return f"ok+{self.extra_calls}ext" if self.extra_calls else "ok"


class Explorer:
    """Owns the lock Redis, the drop proxy and one prefork worker with two children (and a spare)."""

    def __init__(self, env: dict[str, str], lock_port: int) -> None:
        self.vendor = connection.vendor
        self.lock_redis = LockRedis(lock_port)
        self.proxy: DropProxy | None = None
        self.env = {
            **env,
            "DJANGO_SETTINGS_MODULE": "tests.explorer.settings",
            "IDEMPOTENT_TESTS_LOCK_REDIS_URL": self.lock_redis.url,
        }
        if self.vendor in PROXIED:
            # The worker reaches the database through the drop proxy (TCP, also for a MariaDB
            # served on its Unix socket: "localhost" is the server on 127.0.0.1).
            db = connection.settings_dict
            self.proxy = DropProxy(PROXY_PORT, server_address(db))
            self.env["DATABASE_URL"] = proxied_url(db, self.proxy.port)
        self.worker: Worker | None = None
        self.spare: Spare | None = None
        self.control: redis.Redis = control()
        self.recordings: dict[str, list[Boundary]] = {}

    def start(self) -> Explorer:
        self.lock_redis.start()
        if self.proxy is not None:
            self.proxy.start()
        self.worker = Worker("explore", self.env, app=APP, extra=("-Q", QUEUE)).start()
        self.spare = Spare("explore1", self.env)
        return self

    def _replace_worker(self) -> None:
        """After main_kill: the spare takes the queue over, and the next spare starts."""
        assert self.spare is not None
        self.worker = self.spare.take_over()
        self.spare = Spare(f"explore{int(self.worker.name.removeprefix('explore')) + 1}", self.env)

    def stop(self) -> None:
        if self.spare is not None:
            self.spare.stop()
        if self.worker is not None:
            self.worker.stop()
            kill_group(self.worker.pid)
        if self.proxy is not None:
            self.proxy.stop()
        self.lock_redis.stop()

    def send(self, kind: str, key: str, task_id: str) -> None:
        KINDS[kind].apply_async((7,), {"idempotency_key": key}, task_id=task_id)

    def record(self, kind: str) -> list[Boundary]:
        """The recording run: one delivery without a fault; its trace lists the boundaries."""
        if kind not in self.recordings:
            key = f"rec-{kind}-{uuid.uuid4().hex[:8]}"
            task_id = str(uuid.uuid4())
            self.send(kind, key, task_id)
            run = Run(Cell(kind, "record", "none"), key, struck=True)
            self.settle(run, [task_id])
            verdict.check(run, [task_id], order=[])
            assert not run.violations, f"the recording run of {kind} failed: {run.violations}"
            assert self.worker is not None
            self.recordings[kind] = [
                Boundary(bid, int(pid) == self.worker.pid) for bid, pid in self.trace(key)
            ]
        return self.recordings[kind]

    def trace(self, key: str) -> list[tuple[str, str]]:
        raw = self.control.lrange(f"explore:trace:{key}", 0, -1)
        return [(text(entry).split()[0], text(entry).split()[1]) for entry in raw]

    def run(self, cell: Cell) -> Run:
        """Strike ``cell``'s fault at its boundary, redeliver and send a duplicate, then check."""
        started = time.monotonic()
        order = [b.id for b in self.record(cell.kind)]
        if cell.boundary not in order:
            raise LookupError(f"{cell.kind} has no boundary {cell.boundary} (it has {order})")
        key = f"x-{cell.kind}-{uuid.uuid4().hex[:10]}"
        run = Run(cell, key)
        self.control.set(f"explore:arm:{key}", f"{cell.boundary} {cell.fault}")
        original, duplicate = str(uuid.uuid4()), str(uuid.uuid4())
        self.send(cell.kind, key, original)
        hit = self._wait_hit(key)
        if hit is None:
            self.control.delete(f"explore:arm:{key}")
            run.notes.append("the boundary was not reached in this run")
        else:
            run.struck = True
            self.strike(run, hit, duplicate)
        self.send(cell.kind, key, original)  # the broker's redelivery of the struck message
        if not self.control.exists(f"explore:sent:{duplicate}"):
            self.send(cell.kind, key, duplicate)
        self.settle(run, [original, duplicate])
        verdict.check(run, [original, duplicate], order)
        run.seconds = time.monotonic() - started
        return run

    def _wait_hit(self, key: str) -> dict[str, Any] | None:
        """Where the armed boundary struck, or None once the key settled without passing it."""
        last: list[Any] = [None, time.monotonic()]

        def reached() -> Any:
            raw = self.control.get(f"explore:hit:{key}")
            if raw is not None:
                return json.loads(raw)
            length = self.control.llen(f"explore:trace:{key}")
            if length != last[0]:
                last[:] = [length, time.monotonic()]
            record = IdempotencyRecord.objects.filter(key=key).first()
            final = record is not None and record.status in (Status.SUCCEEDED, Status.FAILED)
            # The boundaries after the completion (release, return, ack) follow it closely: only a
            # key final and quiet has passed them all.
            return "settled" if final and time.monotonic() - last[1] > 3 * QUIET_SECONDS else None

        hit = wait_for(reached, timeout=REACH_SECONDS, what=f"the boundary for {key}")
        return hit if isinstance(hit, dict) else None

    def strike(self, run: Run, hit: dict[str, Any], duplicate: str) -> None:
        fault, go = run.cell.fault, f"explore:go:{run.key}"
        assert self.worker is not None
        if fault == "child_kill":
            os.kill(hit["pid"], signal.SIGKILL)
        elif fault == "main_kill":
            self.kill_main()
        elif fault == "db_kill":
            if hit["backend"] is None:
                run.applied = False
                run.notes.append("no database connection was open")
            else:
                run.notes.append(f"backend {hit['backend']} killed: {terminate(hit['backend'])}")
            self.control.rpush(go, "go")
        elif fault == "ambiguous_commit":
            assert self.proxy is not None
            run.applied = self.proxy.arm(hit["port"])
            run.notes.append(f"reply dropped: {run.applied}")
            self.control.rpush(go, "go")
        elif fault == "lock_restart":
            self.restart_lock_redis(go)
        elif fault == "pause":
            self.pause(run, hit, duplicate)
        run.notes.append(f"{fault} struck pid {hit['pid']} at {hit['boundary']}")

    def kill_main(self) -> None:
        """W4: SIGKILL the worker's main process and its group; the spare takes the queue over
        once every process of the group is gone and the broker has seen their connections close."""
        assert self.worker is not None and self.worker.process is not None
        killed = self.worker.pid  # also its process group (a session of its own)
        os.kill(killed, signal.SIGKILL)
        kill_group(killed)  # its orphaned children die with the group, as in W4
        self.worker.process.wait(timeout=30)
        self.worker.log_file.close()
        wait_for(lambda: not group_alive(killed), timeout=30, what="the killed worker's processes to exit")
        broker_round_trip()
        self._replace_worker()

    def restart_lock_redis(self, go: str) -> None:
        """R1: the lock Redis dies without persistence and comes back empty; the holder goes on at
        once, as it would (stalling it past its lease would be another fault). SIGKILL rather than
        SHUTDOWN NOSAVE, whose client call takes seconds to give up on the closed connection."""
        assert self.lock_redis.process is not None
        self.lock_redis.process.kill()
        self.lock_redis.process.wait(timeout=30)
        self.control.rpush(go, "go")
        self.lock_redis.start()

    def pause(self, run: Run, hit: dict[str, Any], duplicate: str) -> None:
        """W6: SIGSTOP the holder, send a duplicate, SIGCONT it once the duplicate settled the key."""
        os.kill(hit["pid"], signal.SIGSTOP)
        self.control.rpush(f"explore:go:{run.key}", "go")
        try:
            before = IdempotencyRecord.objects.filter(key=run.key).values_list("fence", flat=True).first()
            self.send(run.cell.kind, run.key, duplicate)
            self.control.set(f"explore:sent:{duplicate}", 1, ex=600)
            with contextlib.suppress(AssertionError):
                wait_for(
                    lambda: IdempotencyRecord.objects.filter(
                        key=run.key, status=Status.SUCCEEDED, fence__gt=before or 0
                    ).exists(),
                    timeout=PAUSE_SECONDS,
                    what="the duplicate to take over",
                )
        finally:
            os.kill(hit["pid"], signal.SIGCONT)

    def settle(self, run: Run, task_ids: list[str]) -> None:
        """Wait until the key is final, every message answered and no delivery of it still runs."""
        last: list[Any] = [None, time.monotonic()]

        def settled() -> bool:
            record = IdempotencyRecord.objects.filter(key=run.key).first()
            answers = read_answers(task_ids)
            final = record is not None and record.status in (Status.SUCCEEDED, Status.FAILED)
            answered = all(answers.get(t, {}).get("status") in ("SUCCESS", "FAILURE") for t in task_ids)
            length = self.control.llen(f"explore:trace:{run.key}")
            if length != last[0]:
                last[:] = [length, time.monotonic()]
            return final and answered and time.monotonic() - last[1] >= QUIET_SECONDS

        try:
            wait_for(settled, timeout=SETTLE_SECONDS, what=f"{run.key} to settle")
        except AssertionError:
            record = IdempotencyRecord.objects.filter(key=run.key).first()
            state = "no record" if record is None else f"{record.status} fence {record.fence}"
            run.violations.append(f"I5 not settled within {SETTLE_SECONDS} s ({state})")
        finally:
            connections.close_all()


class Spare:
    """A worker started ahead on a queue of its own, which takes the explorer's queue over once
    main_kill killed the worker: a cell does not wait for a worker to start (seconds under load),
    and still only one worker consumes the queue at a time."""

    def __init__(self, name: str, env: dict[str, str]) -> None:
        self.worker = Worker(name, env, app=APP, extra=("-Q", f"{name}-idle"))
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._start, name=f"start {name}", daemon=True)
        self.thread.start()

    def _start(self) -> None:
        try:
            self.worker.start()
        except BaseException as error:  # re-raised by take_over, in the test's thread
            self.error = error

    def _started(self) -> Worker:
        self.thread.join(timeout=120)
        if self.error is not None:
            raise self.error
        assert not self.thread.is_alive(), f"worker {self.worker.name} did not start within 120 s"
        return self.worker

    def take_over(self) -> Worker:
        worker = self._started()
        node = host_format(f"{worker.name}@%h")
        replies = KINDS["external"].app.control.add_consumer(
            QUEUE, destination=[node], reply=True, timeout=30
        )
        assert replies, f"{node} did not answer add_consumer {QUEUE}"
        return worker

    def stop(self) -> None:
        with contextlib.suppress(BaseException):
            self._started().stop()
        if self.worker.process is not None:
            kill_group(self.worker.pid)


def group_alive(pgid: int) -> bool:
    """Whether a process of group ``pgid`` still runs (a zombie has closed its sockets)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid and fields[0] != "Z":
                return True
    return False


def broker_round_trip() -> None:
    """One round trip to the broker's Redis once every process of a killed worker exited (a pool
    child forked after the main process connected shares its broker socket). Redis answers it only
    after handling the events already pending, the closed connections among them; otherwise a
    BRPOP the dead worker left blocked could take the redelivery sent next and write it to a dead
    socket: the message is lost and the key never settles."""
    url = settings.CELERY_BROKER_URL
    if url.startswith("redis"):
        client = redis.Redis.from_url(url)
        try:
            client.ping()
        finally:
            client.close()


def terminate(backend: int) -> bool:
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT pg_terminate_backend(%s)", [backend])
            return bool(cursor.fetchone()[0])
        cursor.execute(f"KILL {int(backend)}")
        return True


def server_address(db: dict[str, Any]) -> tuple[str, int]:
    """The database server's TCP address (``localhost``, MariaDB's Unix socket, is 127.0.0.1)."""
    host = db["HOST"] if db["HOST"] not in ("", "localhost") else "127.0.0.1"
    return host, int(db["PORT"] or (5432 if connection.vendor == "postgresql" else 3306))


def proxied_url(db: dict[str, Any], port: int) -> str:
    """The worker's DATABASE_URL: the same database and user, through the proxy on ``port``."""
    scheme = "postgres" if connection.vendor == "postgresql" else "mysql"
    user = db["USER"] + (f":{db['PASSWORD']}" if db["PASSWORD"] else "")
    return f"{scheme}://{user}@127.0.0.1:{port}/{db['NAME']}"
