"""``python -m bench MODE ...``: repeatable benchmarks, one JSON line of figures each.

Modes:
  hop [CALLS]                     one Redis round trip through runtime.redis_io vs redis-py
  schedule [BACKLOG RATE SECONDS] bulk create, bytes/task, poller enqueue rate and lag
"""

from __future__ import annotations

import argparse
import sys

from bench import hop, schedule
from bench.common import emit, redis_for_bench


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--redis-url", help="use this (disposable!) server instead of starting one")
    modes = parser.add_subparsers(dest="mode", required=True)
    p_hop = modes.add_parser("hop", help="Redis round-trip cost through the layer")
    p_hop.add_argument("calls", type=int, nargs="?", default=20_000)
    p_sched = modes.add_parser("schedule", help="scheduling-core figures")
    p_sched.add_argument("backlog", type=int, nargs="?", default=100_000)
    p_sched.add_argument("rate", type=int, nargs="?", default=5000)
    p_sched.add_argument("seconds", type=float, nargs="?", default=30.0)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    with redis_for_bench(args.redis_url) as url:
        if args.mode == "hop":
            emit({"mode": "hop", "calls": args.calls, **hop.run(url, args.calls)})
        elif args.mode == "schedule":
            figures = schedule.run(url, args.backlog, args.rate, args.seconds)
            emit({"mode": "schedule", **figures})
    return 0


if __name__ == "__main__":
    sys.exit(main())
