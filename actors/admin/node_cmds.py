"""``metronome serve`` (run a node) and ``metronome migrate`` (convert a namespace to this
version's Redis layout): the commands that run without a node's API."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from actors.admin.exits import EXIT_OK, EXIT_OTHER, EXIT_UNAVAILABLE, EXIT_USAGE
from actors.store.keys import DEFAULT_BUCKETS, MAX_BUCKETS


def cmd_migrate(args: argparse.Namespace) -> int:
    import trio

    from actors.domain.errors import LayoutMismatch
    from actors.store.migrate import migrate
    from runtime.config import RedisSection
    from runtime.errors import ConfigError, RedisUnavailable
    from runtime.redis_io import RedisClient

    if not 1 <= args.buckets <= MAX_BUCKETS:
        print(f"metronome: --buckets must be within 1..{MAX_BUCKETS}, got {args.buckets}",
              file=sys.stderr)  # fmt: skip
        return EXIT_USAGE

    try:  # a URL that is not one, as [redis] url would be refused
        settings = RedisSection(url=args.redis, cluster=args.cluster)
        client = RedisClient.from_settings(args.redis, settings)
    except (ValueError, ConfigError) as exc:
        print(f"metronome: --redis: {exc}", file=sys.stderr)
        return EXIT_USAGE

    async def run() -> int:
        try:
            return await migrate(client, args.namespace, buckets=args.buckets, force=args.force)
        finally:
            await client.aclose()

    try:
        moved = trio.run(run)
    except LayoutMismatch as exc:
        print(f"metronome: {exc}", file=sys.stderr)
        return EXIT_OTHER
    except RedisUnavailable as exc:
        print(f"metronome: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    print(
        f"{args.namespace}: {moved} tasks migrated; the namespace is at the current layout, "
        "with compact messages (nodes of this version write them from their next start)"
    )
    return EXIT_OK


def serve_node(node_args: list[str]) -> int:
    """``python -m runtime`` puts the current directory on the import path; a console
    script does not, so add it: handler modules next to node.toml import either way (and
    in the node's child processes, which inherit PYTHONPATH)."""
    from runtime.__main__ import main as serve

    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join([cwd, *paths])
    return serve(node_args)


def add_node_commands(commands: Any) -> None:
    """``metronome serve`` and ``metronome migrate``: they talk to no API (a node, Redis)."""
    serve = commands.add_parser("serve", help="run a node (python -m runtime NODE_TOML)")
    serve.add_argument("node_args", nargs=argparse.REMAINDER, metavar="NODE_TOML [--check ...]",
                       help="what python -m runtime takes; handler modules are imported from "
                       "the current directory too")  # fmt: skip

    migrate = commands.add_parser(
        "migrate",
        help="convert a namespace an older Metronome wrote to this version's Redis layout "
        "(stop its nodes first; talks to Redis, not to the API)",
    )
    migrate.add_argument("--redis", required=True, metavar="URL", help="the namespace's Redis")
    migrate.add_argument("--namespace", default="metronome", help="the key prefix to convert")
    migrate.add_argument("--buckets", type=int, default=DEFAULT_BUCKETS,
                         help="buckets per partition ([scheduler] buckets)")  # fmt: skip
    migrate.add_argument("--cluster", action="store_true", help="the Redis is a Redis Cluster")
    migrate.add_argument("--force", action="store_true",
                         help="migrate even though nodes of the namespace reported in within "
                         "15 s (only when they are known to be stopped)")  # fmt: skip
