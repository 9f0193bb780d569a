"""``python -m bench MODE ...``: repeatable benchmarks, one JSON line of figures each.

Modes:
  fire N INTERVAL_S DURATION_S    end to end with real nodes: fires/s, lag, missed, duplicates,
                                  CPU per fire (Redis, each node process); --cluster M
  idle N [SECONDS]                CPU of an idle node and Redis bytes per task with N tasks
  reclaim [K LEASE_S]             time from kill -9 of a node to its messages running elsewhere
  schedule [BACKLOG RATE SECONDS] bulk create, bytes/task, poller enqueue rate and lag
  hop [CALLS]                     one Redis round trip through runtime.redis_io vs redis-py
  api [--rate R --seconds S ...]  HTTP API: bulk and single creates/s, p99 at a steady rate
  layout [N] [--only V,V]         Redis bytes per task: this layout against the previous one
  screenshots [OUT_DIR]           PNGs of the dashboard's views (default docs/), in Chromium
  scrape N [SCRAPES]              what one /metrics scrape costs a node with N tasks
  scripts [N BATCH]               Redis µs per task of each fire-path script, and of its pieces
  drain [N]                       one consumer process emptying a stream of N: messages/s, CPU
  bullmq N INTERVAL_S DURATION_S  the same fires through BullMQ (Node.js), measured alike
"""

from __future__ import annotations

import argparse
import sys
import typing

from actors.domain.schedules import Overlap
from bench import (
    api,
    bullmq,
    chaos,
    drain,
    fire,
    hop,
    idle,
    layout,
    reclaim,
    schedule,
    scrape,
    screenshots,
    scripts,
)
from bench.common import emit, redis_for_bench
from runtime import logging as node_logging
from runtime.embedded_redis import find_server_binary
from runtime.testing.local_redis import LocalCluster


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
    p_fire = modes.add_parser("fire", help="end-to-end fires with real node processes")
    p_fire.add_argument("n", type=int)
    p_fire.add_argument("interval_s", type=float)
    p_fire.add_argument("duration_s", type=float)
    p_fire.add_argument("--nodes", type=int, default=1)
    p_fire.add_argument("--concurrency", type=int, default=200, help="handler slots per node")
    p_fire.add_argument("--log-level", default="info", help="the nodes' [log] level")
    p_fire.add_argument(
        "--split", action="store_true", help="node 0 only polls; the other nodes only consume"
    )
    p_fire.add_argument(
        "--flaky",
        action="store_true",
        help="one fire in ten fails its first attempt; its retry must run (retries_lost)",
    )
    p_fire.add_argument(
        "--chaos",
        type=float,
        default=0.0,
        metavar="S",
        help="SIGKILL a random child process of the node every S seconds (needs --processes)",
    )
    p_fire.add_argument(
        "--cluster", type=int, default=0, metavar="M",
        help="run against a local Redis Cluster of M masters (CPU figures per shard)",
    )  # fmt: skip
    p_fire.add_argument(
        "--scrape", type=float, default=0.0, metavar="S",
        help="GET node 0's /metrics every S seconds (gauge cache off); figures under scrapes",
    )  # fmt: skip
    p_fire.add_argument(
        "--wait-ms", type=float, default=0.0, metavar="MS",
        help="handlers that wait MS ms after recording (as an I/O call would); 0: they return",
    )  # fmt: skip
    p_fire.add_argument(
        "--set", action="append", default=[], metavar="SECTION.KEY=VALUE", dest="settings",
        help="a node.toml setting for every node (TOML value), e.g. scheduler.min_tick_s=0.01",
    )  # fmt: skip
    p_fire.add_argument(
        "--overlap", default="allow_all", choices=typing.get_args(Overlap),
        help="every task's overlap policy (its cost a fire; the handler is quick)",
    )  # fmt: skip
    p_fire.add_argument(
        "--types", type=int, default=1, metavar="K",
        help="spread the tasks over K task types bench0.. (K streams: on a Cluster, K slots; "
        "--set consumers.bench0.KEY=V sets one type's)",
    )  # fmt: skip
    p_fire.add_argument(
        "--processes",
        type=int,
        default=0,
        metavar="K",
        help="[processes] of each node: the poller in a child process, K consumer processes",
    )
    p_chaos = modes.add_parser("chaos", help="real faults under real nodes: what was lost")
    p_chaos.add_argument("scenario", choices=chaos.SCENARIOS)
    p_chaos.add_argument("--n", type=int, default=2000, help="periodic tasks")
    p_chaos.add_argument("--interval-s", type=float, default=2.0)
    p_chaos.add_argument("--duration-s", type=float, default=60.0)
    p_chaos.add_argument("--nodes", type=int, default=3)
    p_chaos.add_argument("--fault-s", type=float, default=5.0, help="outage or stall length")
    p_chaos.add_argument("--every-s", type=float, default=10.0, help="kill scenarios: how often")
    p_chaos.add_argument(
        "--hold-s", type=float, default=15.0, help="long-handler: how long each handler runs"
    )
    p_reclaim = modes.add_parser("reclaim", help="reclaim latency after kill -9")
    p_reclaim.add_argument("k", type=int, nargs="?", default=20)
    p_reclaim.add_argument("lease_s", type=float, nargs="?", default=5.0)
    p_idle = modes.add_parser("idle", help="idle node CPU and bytes per task")
    p_idle.add_argument("n", type=int)
    p_idle.add_argument("seconds", type=float, nargs="?", default=20.0)
    p_idle.add_argument(
        "--processes", type=int, default=0, metavar="K", help="[processes]: scheduler + K consumers"
    )
    p_api = modes.add_parser("api", help="HTTP API throughput and latency")
    p_api.add_argument("--rate", type=int, default=1000, help="steady single creates/s")
    p_api.add_argument("--seconds", type=float, default=20.0)
    p_api.add_argument("--bulk-total", type=int, default=100_000)
    p_api.add_argument("--bulk-size", type=int, default=5000)
    p_api.add_argument("--bulk-senders", type=int, default=2, help="concurrent bulk senders")
    p_api.add_argument("--workers", type=int, default=8, help="client threads")
    p_api.add_argument("--log-level", default="info", help="the node's [log] level")
    p_api.add_argument(
        "--client",
        choices=["lean", "httpx"],
        default="lean",
        help="single creates through a lean http.client (default) or actors.admin.client (httpx)",
    )
    p_api.add_argument(
        "--processes", type=int, default=0, metavar="N", help="[processes] api = N (0: in the node)"
    )
    p_layout = modes.add_parser("layout", help="bytes per task of layout variants")
    p_layout.add_argument("n", type=int, nargs="?", default=100_000)
    p_layout.add_argument(
        "--only", default=layout.VARIANTS, type=layout.variants, metavar="V,V",
        help=f"the variants to measure (default all: {', '.join(layout.VARIANTS)})",
    )  # fmt: skip
    p_scrape = modes.add_parser("scrape", help="cost of one /metrics scrape")
    p_scrape.add_argument("n", type=int, nargs="?", default=1_000_000)
    p_scrape.add_argument("scrapes", type=int, nargs="?", default=100)
    p_scripts = modes.add_parser("scripts", help="Redis cost of each fire-path script")
    p_scripts.add_argument("n", type=int, nargs="?", default=20_000)
    p_scripts.add_argument("batch", type=int, nargs="?", default=50)
    p_drain = modes.add_parser("drain", help="one consumer process emptying a stream")
    p_drain.add_argument("n", type=int, nargs="?", default=300_000)
    p_drain.add_argument("--concurrency", type=int, default=1000, help="handler slots")
    p_bullmq = modes.add_parser("bullmq", help="the same fires through BullMQ, for comparison")
    p_bullmq.add_argument("n", type=int)
    p_bullmq.add_argument("interval_s", type=float)
    p_bullmq.add_argument("duration_s", type=float)
    p_bullmq.add_argument("--workers", type=int, default=1, help="worker processes")
    p_bullmq.add_argument("--concurrency", type=int, default=200, help="per worker")
    p_shots = modes.add_parser("screenshots", help="PNGs of the dashboard for docs/")
    p_shots.add_argument("out_dir", nargs="?", default="docs")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.mode == "screenshots":  # starts a Redis of its own
        emit({"mode": "screenshots", **screenshots.main(args.out_dir)})
        return 0
    # Only the one JSON line goes to stdout: the bench's own lifecycle lines (the store logs
    # "created" per task) would drown it.
    node_logging.configure(node="bench", level="warning", stream=sys.stderr)
    if args.mode == "fire" and args.cluster:
        cluster = LocalCluster(find_server_binary(), size=args.cluster).start()
        try:
            figures = fire.run(
                cluster.url, args.n, args.interval_s, args.duration_s, args.nodes,
                args.concurrency, args.log_level, args.split, args.processes, args.chaos,
                args.flaky, args.scrape, shards=[node.url for node in cluster.nodes],
                settings=tuple(args.settings), overlap=args.overlap, types=args.types,
                wait_ms=args.wait_ms,
            )  # fmt: skip
        finally:
            cluster.remove()
        emit({"mode": "fire", **figures})
        return 0
    with redis_for_bench(args.redis_url) as url:
        if args.mode == "hop":
            emit({"mode": "hop", "calls": args.calls, **hop.run(url, args.calls)})
        elif args.mode == "fire":
            figures = fire.run(
                url, args.n, args.interval_s, args.duration_s, args.nodes, args.concurrency,
                args.log_level, args.split, args.processes, args.chaos, args.flaky, args.scrape,
                settings=tuple(args.settings), overlap=args.overlap, types=args.types,
                wait_ms=args.wait_ms,
            )  # fmt: skip
            emit({"mode": "fire", **figures})
        elif args.mode == "chaos":
            figures = chaos.run(
                args.scenario, args.n, args.interval_s, args.duration_s, args.nodes,
                args.fault_s, args.every_s, hold_s=args.hold_s,
            )  # fmt: skip
            emit({"mode": "chaos", **figures})
        elif args.mode == "reclaim":
            emit({"mode": "reclaim", **reclaim.run(url, args.k, args.lease_s)})
        elif args.mode == "idle":
            emit({"mode": "idle", **idle.run(url, args.n, args.seconds, args.processes)})
        elif args.mode == "bullmq":
            figures = bullmq.run(
                url, args.n, args.interval_s, args.duration_s, args.workers, args.concurrency
            )
            emit({"mode": "bullmq", **figures})
        elif args.mode == "scripts":
            emit({"mode": "scripts", **scripts.run(url, args.n, args.batch)})
        elif args.mode == "drain":
            emit({"mode": "drain", **drain.run(url, args.n, args.concurrency)})
        elif args.mode == "scrape":
            emit({"mode": "scrape", **scrape.run(url, args.n, args.scrapes)})
        elif args.mode == "layout":
            emit({"mode": "layout", "n": args.n, **layout.run(url, args.n, args.only)})
        elif args.mode == "api":
            figures = api.run(
                url, args.rate, args.seconds, args.bulk_total, args.bulk_size, args.workers,
                args.log_level, args.bulk_senders, args.processes, args.client,
            )  # fmt: skip
            emit({"mode": "api", **figures})
        elif args.mode == "schedule":
            figures = schedule.run(url, args.backlog, args.rate, args.seconds)
            emit({"mode": "schedule", **figures})
    return 0


if __name__ == "__main__":
    sys.exit(main())
