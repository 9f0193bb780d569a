"""``python -m runtime node.toml``: run one node until SIGINT/SIGTERM/SIGHUP
(``python -m runtime --version``: print the version and exit).

Exit status: 0 after a clean stop, 1 when the root supervisor gave up, 2 on a usage or
configuration error (one line on stderr naming the problem); a ``--part`` child whose own
tree gave up exits 88 (``runtime.process.EXIT_PART_GAVE_UP``), for its node to count, and
one that refuses its node's config 89 (``EXIT_PART_CONFIG``), for its node to give up.
"""

from __future__ import annotations

import argparse
import sys
from functools import partial
from pathlib import Path

import trio

from runtime import gc_policy
from runtime import logging as node_logging
from runtime.app import Invocation, load_app
from runtime.errors import ConfigError, RuntimeStartError
from runtime.metrics import enable_multiprocess
from runtime.node import EXIT_CONFIG, EXIT_GAVE_UP, ignore_the_groups_signals, run_node
from runtime.process import EXIT_PART_CONFIG, child_grace_s
from runtime.version import __version__

USAGE = """\
Run one Metronome node: the actors named in NODE_TOML, supervised, until SIGINT or SIGTERM.

The first signal stops the node gracefully within [node] shutdown_grace_s (running handlers
finish, unstarted work is handed back); a second signal stops it at once.
See deploy/node.toml for an annotated example and docs/CONFIGURATION.md for every key.
"""


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m runtime",
        description=USAGE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"metronome {__version__}")
    parser.add_argument("config", metavar="NODE_TOML", type=Path, help="the node's config file")
    parser.add_argument(
        "--check",
        action="store_true",
        help="validate the config (and import its handlers) and exit; 0 = valid",
    )
    parser.add_argument("--log-format", choices=["json", "console"], help="override [log] format")
    parser.add_argument(
        "--part",
        metavar="NAME",
        help="run only part NAME of the node, as a child process of it (the node starts these "
        "itself for [processes]; see runtime/process.py)",
    )
    parser.add_argument(
        "--report-fd",
        metavar="FD",
        type=int,
        help="with --part: write health reports to the node on this inherited descriptor",
    )
    parser.add_argument(
        "--config-digest",
        metavar="SHA256",
        help="with --part: refuse NODE_TOML unless it is still the file the node read",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.part is not None:
        ignore_the_groups_signals()  # before the imports: a Ctrl-C then is the node's too
    if not args.check:
        # Before anything imports prometheus-client: every process of the node writes its
        # samples where /metrics sums them (runtime/metrics.py).
        enable_multiprocess()
    try:
        app = load_app(args.config)
        if args.config_digest and app.digest != args.config_digest:
            raise ConfigError(
                f"{args.config}: changed since its node started (a part runs the file its "
                "node read): restart the node to apply the change"
            )
        invocation = Invocation(
            args.config.resolve(), args.part, check=args.check, config_digest=app.digest
        )
        if args.check:
            app.build_tree(app.config, invocation)  # resolves handlers; starts nothing
            print(f"{args.config}: ok")
            return 0
        name = app.node.name if args.part is None else f"{app.node.name}/{args.part}"
        node_logging.configure(
            node=name,
            format=args.log_format or app.log.format,
            level=app.log.level,
            stream=None if args.part is None else node_logging.to_parent(sys.stdout),
        )
        root = app.build_tree(app.config, invocation)
        gc_policy.tune()
        grace_s = app.node.shutdown_grace_s
        if args.part is not None:
            grace_s = child_grace_s(grace_s)
        return trio.run(
            partial(
                run_node,
                root,
                shutdown_grace_s=grace_s,
                child=args.part is not None,
                report_fd=args.report_fd if args.part is not None else None,
            )
        )
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        # A part its node started (it reads our reports) must know no restart mends it.
        return EXIT_PART_CONFIG if args.report_fd is not None else EXIT_CONFIG
    except RuntimeStartError as exc:
        print(f"cannot start: {exc}", file=sys.stderr)
        return EXIT_GAVE_UP


if __name__ == "__main__":
    sys.exit(main())
