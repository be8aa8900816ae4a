"""``python -m benchmarks``: run the sections and print their tables (see BENCHMARKS.md)."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.settings")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument(
        "--sections",
        default="overhead,e2e,scale",
        help="Comma-separated sections to run: overhead, e2e, scale (default: all).",
    )
    parser.add_argument(
        "--calls", type=int, default=1000, help="Calls per path in section 1 (default: 1000)."
    )
    parser.add_argument(
        "--tasks", type=int, default=1000, help="Messages per system and run, no-op workload (default: 1000)."
    )
    parser.add_argument(
        "--work-tasks",
        type=int,
        default=400,
        help="Messages per system and run, 5 ms workload (default: 400).",
    )
    parser.add_argument("--runs", type=int, default=3, help="Interleaved runs of every system (default: 3).")
    parser.add_argument(
        "--records",
        default="0,100000,1000000",
        help="Table sizes of section 3 (default: 0,100000,1000000).",
    )
    parser.add_argument(
        "--scale-calls", type=int, default=500, help="Calls per size in section 3 (default: 500)."
    )
    parser.add_argument("--purge", type=int, default=100_000, help="Expired rows to purge (default: 100000).")
    parser.add_argument(
        "--memory-tasks", type=int, default=3000, help="Tasks run by the measured worker (default: 3000)."
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="Small counts (about a minute per section), for iterating; pick one with --sections.",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.calls, args.tasks, args.work_tasks, args.runs = 300, 300, 150, 1
        args.records, args.scale_calls, args.purge, args.memory_tasks = "0,100000", 200, 20_000, 1000
    from benchmarks import (
        celery_app,  # noqa: F401  (django.setup() and the tasks)
        workers,
    )

    # Ctrl-C, and make, a CI runner or kill (SIGTERM, SIGHUP), stop the workers and end the run.
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _interrupt)
    try:
        return _run(args, parser)
    finally:
        workers.stop_all()


_stopping = False  # an interrupt is stopping the workers: a second one kills them


def _interrupt(signum: int, frame: object) -> None:
    """Stop the workers and exit with 130, whatever the run was doing.

    Not by raising KeyboardInterrupt: raised inside a ``__del__`` (redis-py's pool) it is only
    printed and the run goes on to its end, and an error raised while unwinding (kombu cancelling
    a consumer on a connection interrupted mid-reply) replaces it and the run ends with status 1.
    """
    global _stopping
    from benchmarks import workers

    if _stopping:  # interrupted again while the workers stop: kill them
        workers.kill_all()
    else:
        _stopping = True
        print(
            f"benchmarks: {signal.Signals(signum).name}; stopping the workers.", file=sys.stderr, flush=True
        )
        workers.stop_all()
    sys.stdout.flush()
    os._exit(130)


def _run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from django.db import connection

    from benchmarks import database, e2e, enqueue, layers, overhead, report, scale

    sections = args.sections.split(",")
    postgresql_only = sorted({"e2e", "scale"} & set(sections))
    if postgresql_only and connection.vendor != "postgresql":
        parser.error(
            f"sections {', '.join(postgresql_only)} run on PostgreSQL only; on {connection.display_name} "
            "run section 1 alone: --sections overhead"
        )
    database.ready()  # each section sets up what it measures; this refuses an unusable URL first
    print(f"# django-idempotent-tasks benchmarks\n\n{report.machine()}\n{report.versions()}\n")
    started = time.monotonic()
    if "overhead" in sections:
        print(overhead.run(args.calls), flush=True)
        print(layers.run(args.calls), flush=True)
        print(enqueue.run(args.calls), flush=True)
    if "e2e" in sections:
        print(e2e.run(args.tasks, args.work_tasks, args.runs), flush=True)
    if "scale" in sections:
        levels = [int(level) for level in args.records.split(",")]
        print(scale.latency(levels, args.scale_calls), flush=True)
        print(scale.purge(args.purge), flush=True)
        print(scale.memory(args.memory_tasks), flush=True)
    print(f"Finished in {time.monotonic() - started:.0f} s; {report.load()}.")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
