"""``metronome``: the admin CLI. Talks to a node's API with signed requests.

    metronome tasks add --type report --cron "0 9 * * 1-5" --tz Europe/Paris --id daily
    metronome tasks explain daily
    metronome tasks upcoming daily -n 5       # the next fires, as they will run
    metronome tasks history daily             # its last fires: fate, lateness, node, error
    metronome attention                       # tasks dead, expired, skipped or late now
    metronome schedule preview --cron "H 9 * * *" --tz Europe/Paris --id daily   # local
    metronome queues
    metronome partitions                      # which poller serves what, what is due
    metronome dlq replay report --all
    metronome tasks backfill daily --from 2025-03-01T00:00:00Z --to 2025-03-08T00:00:00Z
    metronome serve deploy/node.toml          # = python -m runtime deploy/node.toml
    metronome migrate --redis redis://host:6379/0 --namespace metronome   # after an upgrade
    metronome --version                       # the release this CLI belongs to

Credentials come from flags or the environment: --url / METRONOME_URL (default
http://127.0.0.1:8080), --key-id / METRONOME_KEY_ID, --secret / METRONOME_SECRET.
Tables by default, --json for scripts (the API's JSON answer, unchanged).

Errors are one line on stderr (--debug adds the traceback of an unexpected one).
Exit status: 0 done; 2 usage error (bad flags, unreadable file, missing confirmation);
3 not found (also: dlq replay of ids that are not there); 4 conflict (exists with another
definition, or a transition not allowed; an action or bulk add done in part); 5 invalid
input; 6 not authenticated or not allowed; 7 the API (for migrate: Redis) is unreachable
or unavailable (502, 503, 504); 1 anything else (a 500 too).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys

from actors.admin.backfill_cmds import add_backfill_commands
from actors.admin.client import ApiError, ApiUnavailable, Client
from actors.admin.exits import (
    EXIT_INVALID,
    EXIT_OK,
    EXIT_OTHER,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    exit_code,
)
from actors.admin.inputs import InvalidArgument, UsageError, checked_name, seconds
from actors.admin.ledger_cmds import add_ledger_commands
from actors.admin.node_cmds import add_node_commands, cmd_migrate, serve_node
from actors.admin.preview_cli import add_schedule_parser, run_schedule
from actors.admin.queue_cmds import add_dlq_commands, add_queue_commands
from actors.admin.tables import terminal_safe
from actors.admin.task_cmds import add_task_commands
from actors.domain.model import MAX_TASK_ID
from runtime.version import __version__

DEFAULT_URL = "http://127.0.0.1:8080"


def build_parser() -> argparse.ArgumentParser:
    """The whole command line: the global flags, then each command group's parsers (each
    group's module adds its own, with the command it runs as ``run``)."""
    parser = argparse.ArgumentParser(
        prog="metronome",
        description=__doc__.split("\n", 1)[1].replace("``", ""),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_global_flags(parser)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_node_commands(commands)
    tasks = add_task_commands(commands)
    add_backfill_commands(commands, tasks)
    add_ledger_commands(commands, tasks)
    add_queue_commands(commands)
    add_schedule_parser(commands)
    add_dlq_commands(commands)
    return parser


def _add_global_flags(parser: argparse.ArgumentParser) -> None:
    """Where the API is, the key to sign with, and how answers are shown."""
    parser.add_argument("--version", action="version", version=f"metronome {__version__}")
    parser.add_argument(
        "--url",
        default=os.environ.get("METRONOME_URL", DEFAULT_URL),
        help=f"the node's API (METRONOME_URL; default {DEFAULT_URL})",
    )
    parser.add_argument(
        "--key-id", default=os.environ.get("METRONOME_KEY_ID"), help="API key id (METRONOME_KEY_ID)"
    )
    parser.add_argument(
        "--secret",
        default=os.environ.get("METRONOME_SECRET"),
        help="API key secret; prefer METRONOME_SECRET: flags show in process lists",
    )
    parser.add_argument("--json", action="store_true", help="print the API's JSON answer")
    parser.add_argument("--timeout", type=seconds, default=30.0, help="seconds per request")
    parser.add_argument("--debug", action="store_true",
                        help="show the traceback of an unexpected error")  # fmt: skip


def _check_arguments(args: argparse.Namespace) -> None:
    """Ids, types and entry ids are checked here: one like ``a/b`` would reach no endpoint
    at all."""
    if getattr(args, "task_id", None) is not None:
        checked_name("task id", args.task_id, MAX_TASK_ID)
    if getattr(args, "command", None) in ("tasks", "dlq") and getattr(args, "type", None):
        checked_name("type", args.type)
    entry = getattr(args, "entry_id", None)
    if entry is not None and not re.fullmatch(r"[0-9]{1,20}-[0-9]{1,20}", entry):
        raise InvalidArgument(f"entry id {entry!r} is not a stream entry id (like 1700000000000-0)")


def _run(args: argparse.Namespace) -> int:
    if not args.key_id or not args.secret:
        print("metronome: give --key-id and --secret (or METRONOME_KEY_ID, METRONOME_SECRET)",
              file=sys.stderr)  # fmt: skip
        return EXIT_USAGE
    try:
        _check_arguments(args)
        with Client(args.url, args.key_id, args.secret, timeout_s=args.timeout) as api:
            data, human, *status = args.run(api, args)
    except UsageError as exc:
        print(f"metronome: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except InvalidArgument as exc:
        print(f"metronome: {exc}", file=sys.stderr)
        return EXIT_INVALID
    except ApiError as exc:
        if args.json:
            print(json.dumps({"status": exc.status, "code": exc.code, "detail": exc.detail,
                              "errors": exc.errors}))  # fmt: skip
        print(f"metronome: {terminal_safe(exc.detail)} ({exc.status} {exc.code})", file=sys.stderr)
        return exit_code(exc)
    except ApiUnavailable as exc:
        print(f"metronome: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    human = terminal_safe(human)
    print(json.dumps(data, indent=2) if args.json else human)
    if status and status[0] != EXIT_OK:  # done in part: say so where errors go
        print(f"metronome: {human.splitlines()[0]}", file=sys.stderr)
        return int(status[0])
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    """The console script. Exit statuses: the module docstring."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["serve"]:  # the rest is python -m runtime's, --check first too
        return serve_node(argv[1:])
    args = build_parser().parse_args(argv)
    if args.command == "serve":  # after global options: the rest from its file on
        return serve_node(args.node_args)
    try:
        if args.command == "migrate":
            return cmd_migrate(args)
        if args.command == "schedule":
            return run_schedule(args)
        code = _run(args)
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        # The reader went away (``metronome tasks ls | head``): stop quietly, and keep
        # Python from complaining again when it flushes stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except KeyboardInterrupt:
        print("metronome: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        if args.debug:
            raise
        print(f"metronome: unexpected error: {type(exc).__name__}: {exc} "
              "(--debug shows the traceback)", file=sys.stderr)  # fmt: skip
        return EXIT_OTHER


if __name__ == "__main__":
    sys.exit(main())
