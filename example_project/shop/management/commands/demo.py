"""Run every cause of duplicate execution against a plain and an idempotent task, with real workers."""

from __future__ import annotations

import contextlib
import shutil
import signal
import tempfile
import time
from pathlib import Path
from typing import Any, NoReturn

import redis
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from shop.demo import broker, report
from shop.demo.scenarios import QUEUE, SCENARIOS, Demo, NotSettled, Outcome
from shop.demo.workers import WorkerGroup

WORKER_ENV = {
    "SHOP_DEMO_HOOKS": "1",
    # Short enough for scenario 2 to see a redelivery within seconds, checked every second.
    "CELERY_VISIBILITY_TIMEOUT": "4",
    "CELERY_UNACKED_RESTORE_INTERVAL": "1",
    "CELERY_UNACKED_RESTORE_THROTTLE": "1",
}


class _Stop:
    """Whether Ctrl-C or SIGTERM asked the demo to stop. The handler's KeyboardInterrupt alone can be
    lost: raised while an object's ``__del__`` runs (a redis ConnectionPool's, say), Python prints
    it and goes on. The request is kept here too and checked before each step."""

    requested = False


def _interrupt(signum: int, frame: Any) -> NoReturn:
    _Stop.requested = True
    raise KeyboardInterrupt


class Command(BaseCommand):
    help = "Run each cause of duplicate execution against a plain and an idempotent charge task, with real Celery workers."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--scenario",
            type=int,
            choices=[s.number for s in SCENARIOS],
            action="append",
            help="Run only this scenario (repeatable). Default: all six.",
        )
        parser.add_argument(
            "--workers",
            type=int,
            default=2,
            help="Worker processes to start, with 2 children each. Default: 2.",
        )

    def handle(
        self, *args: Any, scenario: list[int] | None, workers: int, verbosity: int, **options: Any
    ) -> None:
        self.verbose = verbosity > 0
        self._check_services()
        selected = [s for s in SCENARIOS if not scenario or s.number in scenario]
        log_dir = Path(tempfile.mkdtemp(prefix="idempotent-demo-"))
        started = time.monotonic()
        # Ctrl-C and SIGTERM both stop the workers and end the run. SIGINT gets a handler of its own:
        # a shell that starts a command in the background (`make test &`, a CI script) makes it
        # ignore SIGINT, and Python keeps an inherited SIG_IGN, so the demo would run on.
        _Stop.requested = False
        previous = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
        outcomes: list[Outcome] = []
        try:
            broker.reset(QUEUE)
            self._progress(f"Starting {workers} celery workers (prefork, 2 processes each) ...")
            with broker.Recorder() as recorder, WorkerGroup(workers, QUEUE, log_dir, WORKER_ENV) as group:
                demo = Demo(recorder)
                for item in selected:
                    self._progress(f"[{item.number}/{len(SCENARIOS)}] {item.title} ...")
                    try:
                        outcome = item(demo)
                    except NotSettled as exc:
                        raise CommandError(f"{exc} Worker logs: {log_dir}\n{group.logs()}") from exc
                    outcomes.append(outcome)
                    self._progress(f"      {report.progress(outcome)}")
                self._progress("Stopping the workers ...")
        except KeyboardInterrupt:
            raise CommandError("Interrupted; the demo's workers were stopped.", returncode=130) from None
        except RuntimeError as exc:  # a worker did not start
            raise CommandError(f"{exc} Worker logs: {log_dir}") from exc
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            with contextlib.suppress(redis.RedisError):
                broker.reset(QUEUE)
        self._report(outcomes, time.monotonic() - started, log_dir)
        shutil.rmtree(log_dir, ignore_errors=True)

    def _progress(self, line: str) -> None:
        if _Stop.requested:  # its KeyboardInterrupt was swallowed somewhere: stop now
            raise KeyboardInterrupt
        if self.verbose:
            self.stdout.write(line)
            self.stdout.flush()

    def _report(self, outcomes: list[Outcome], seconds: float, log_dir: Path) -> None:
        self.stdout.write("")
        self.stdout.write(report.table(outcomes))
        self.stdout.write("")
        dedups = sum(o.gateway_dedups for o in outcomes)
        self.stdout.write(
            f"The gateway deduplicated {report.plural(dedups, 'request')} of the idempotent task; "
            f"the whole run took {seconds:.0f} s."
        )
        failed = report.duplicates(outcomes)
        if failed:
            numbers = ", ".join(str(o.number) for o in failed)
            raise CommandError(
                f"The idempotent task did not charge exactly once in scenario(s) {numbers}. Worker logs: {log_dir}"
            )
        self.stdout.write(
            self.style.SUCCESS("The idempotent task charged exactly once per key in every scenario.")
        )

    def _check_services(self) -> None:
        try:
            redis.Redis.from_url(settings.CELERY_BROKER_URL, socket_connect_timeout=2).ping()
        except redis.RedisError as exc:
            raise CommandError(
                f"Redis does not answer at {settings.CELERY_BROKER_URL} ({exc}). Start it, or set REDIS_URL."
            ) from exc
        executor = MigrationExecutor(connection)
        if executor.migration_plan(executor.loader.graph.leaf_nodes()):
            raise CommandError(
                "The database is not migrated: run `python example_project/manage.py migrate` first."
            )
