"""Profile first executions (section 1's direct calls) with cProfile and print where the CPU goes.

Usage: DATABASE_URL=... REDIS_URL=... python -m benchmarks.profile_first [--calls 2000] [--top 30]
Times are CPU (process time). The functions are sorted by their own time (tottime) and by cumulative time; compare the totals
with table 1d (bare drivers, the package's I/O layer, the whole delivery).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
import time
import uuid

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.settings")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.profile_first", description=__doc__)
    parser.add_argument("--calls", type=int, default=2000, help="First executions profiled (default: 2000).")
    parser.add_argument("--top", type=int, default=30, help="Functions listed per ordering (default: 30).")
    args = parser.parse_args(argv)
    from benchmarks import celery_app, database  # noqa: F401  (django.setup() and the tasks)
    from benchmarks.systems import idempotent

    database.ready()
    run = uuid.uuid4().hex[:8]
    for n in range(200):  # warm connections, caches and prepared plans
        idempotent("u", False, idempotency_key=f"warm-{run}-{n}")
    profile = cProfile.Profile(time.process_time)  # CPU, not the wait for the servers
    cpu = time.process_time()
    profile.enable()
    for n in range(args.calls):
        idempotent("u", False, idempotency_key=f"first-{run}-{n}")
    profile.disable()
    cpu = time.process_time() - cpu
    print(f"{args.calls} first executions, {cpu / args.calls * 1e6:.0f} µs CPU per call under cProfile\n")
    for order in ("tottime", "cumulative"):
        out = io.StringIO()
        pstats.Stats(profile, stream=out).strip_dirs().sort_stats(order).print_stats(args.top)
        print(out.getvalue())
    out = io.StringIO()  # what the delivery's own steps call, beside the round trips
    pstats.Stats(profile, stream=out).strip_dirs().print_callees(r"tasks.py.*\(__call__\)|\(attempt\)")
    print(out.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
