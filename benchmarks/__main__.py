"""``python -m benchmarks``: run the sections and print their tables (see BENCHMARKS.md)."""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.settings")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--sections", default="overhead,e2e,scale", help="Sections to run (default: all).")
    parser.add_argument(
        "--calls", type=int, default=2000, help="Calls per path in section 1 (default: 2000)."
    )
    args = parser.parse_args(argv)
    from benchmarks import (
        celery_app,  # noqa: F401  (django.setup() and the tasks)
        overhead,
        report,
    )

    print(f"# django-idempotent-tasks benchmarks\n\n{report.machine()}\n{report.versions()}\n")
    started = time.monotonic()
    sections = args.sections.split(",")
    if "overhead" in sections:
        print(overhead.run(args.calls), flush=True)
    print(f"Finished in {time.monotonic() - started:.0f} s; {report.load()}.")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
