"""``metronome``: the admin CLI. Talks to a node's API with signed requests.

    metronome tasks add --type report --cron "0 9 * * 1-5" --tz Europe/Paris --id daily
    metronome tasks explain daily
    metronome queues
    metronome dlq replay report --all
    metronome serve deploy/node.toml          # = python -m runtime deploy/node.toml
    metronome migrate --redis redis://host:6379/0 --namespace metronome   # after an upgrade

Credentials come from flags or the environment: ``--url``/``METRONOME_URL`` (default
http://127.0.0.1:8080), ``--key-id``/``METRONOME_KEY_ID``, ``--secret``/``METRONOME_SECRET``.
Tables by default, ``--json`` for scripts (the API's JSON answer, unchanged).

Exit status: 0 done; 2 usage error; 3 not found; 4 conflict (exists with another
definition, or a transition not allowed); 5 invalid input; 6 not authenticated or not
allowed; 7 the API (for `migrate`: Redis) is unreachable or unavailable; 1 any other refusal.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from actors.admin.client import ApiError, ApiUnavailable, Client
from actors.admin.inputs import (
    UsageError,
    add_schedule_flags,
    payload_from,
    schedule_from,
)
from actors.admin.tables import queue_rows, show_task, table, task_rows, when
from actors.domain.model import STATUSES
from actors.store.keys import DEFAULT_BUCKETS, MAX_BUCKETS

EXIT_OK, EXIT_OTHER, EXIT_USAGE = 0, 1, 2
EXIT_NOT_FOUND, EXIT_CONFLICT, EXIT_INVALID, EXIT_AUTH, EXIT_UNAVAILABLE = 3, 4, 5, 6, 7
DEFAULT_URL = "http://127.0.0.1:8080"


def exit_code(error: ApiError) -> int:
    if error.status == 404:
        return EXIT_NOT_FOUND
    if error.status == 409:
        return EXIT_CONFLICT
    if error.status in (400, 413, 422):
        return EXIT_INVALID
    if error.status in (401, 403):
        return EXIT_AUTH
    if error.status >= 500:
        return EXIT_UNAVAILABLE
    return EXIT_OTHER


# -- commands ---------------------------------------------------------------------------

Result = tuple[Any, str]
"""(the API's JSON answer, its human rendering)."""


def cmd_tasks_add(api: Client, args: argparse.Namespace) -> Result:
    if args.file is not None:
        text = sys.stdin.read() if args.file == "-" else Path(args.file).read_text("utf-8")
        try:
            tasks = json.loads(text) if text.lstrip().startswith("[") else [
                json.loads(line) for line in text.splitlines() if line.strip()
            ]  # fmt: skip
        except ValueError as exc:
            raise UsageError(f"--file: not a JSON list or JSON lines: {exc}") from None
        created: dict[str, Any] = {"created": 0, "existing": 0, "conflicts": 0, "results": []}
        for i in range(0, len(tasks), args.batch):
            part = api.create_tasks(tasks[i : i + args.batch])
            for key in ("created", "existing", "conflicts"):
                created[key] += part[key]
            created["results"] += part["results"]
        human = (
            f"{created['created']} created, {created['existing']} already existed, "
            f"{created['conflicts']} conflicts"
        )
        return created, human
    if args.type is None:
        raise UsageError("tasks add: give --type (or --file for bulk)")
    schedule = schedule_from(args, required=True)
    assert schedule is not None
    result = api.create_task(args.type, schedule, payload_from(args.payload), args.id)
    verb = "created" if result["created"] else "already exists (same definition)"
    return result, f"{result['task_id']} {verb}"


def cmd_tasks_get(api: Client, args: argparse.Namespace) -> Result:
    task = api.get_task(args.task_id)
    return task, show_task(task)


def cmd_tasks_ls(api: Client, args: argparse.Namespace) -> Result:
    if args.all:
        tasks = list(api.iter_tasks(args.type, args.status))
        return {"tasks": tasks, "next_cursor": None}, task_rows(tasks)
    page = api.list_tasks(args.type, args.status, args.cursor, args.limit)
    human = task_rows(page["tasks"])
    if page["next_cursor"]:
        human += f"\n(more: --cursor {page['next_cursor']}, or --all)"
    return page, human


def cmd_tasks_update(api: Client, args: argparse.Namespace) -> Result:
    changes: dict[str, Any] = {}
    schedule = schedule_from(args, required=False)
    if schedule is not None:
        changes["schedule"] = schedule
    if args.payload is not None:
        changes["payload"] = payload_from(args.payload)
    if not changes:
        raise UsageError("tasks update: give --payload and/or a schedule")
    result = api.update_task(args.task_id, **changes)
    return result, f"{result['task_id']} updated ({result['status']})"


def _simple(action: str, verb: str) -> Callable[[Client, argparse.Namespace], Result]:
    def command(api: Client, args: argparse.Namespace) -> Result:
        result: dict[str, Any] = getattr(api, action)(args.task_id)
        return result, f"{args.task_id} {verb}" + (
            f" ({result['status']})" if "status" in result else ""
        )

    return command


def cmd_tasks_trigger(api: Client, args: argparse.Namespace) -> Result:
    result = api.trigger(args.task_id)
    return result, f"{args.task_id} triggered: fire {result['schedule_id']} queued"


def cmd_tasks_explain(api: Client, args: argparse.Namespace) -> Result:
    facts = api.explain(args.task_id)
    return facts, "\n".join(f"- {line}" for line in facts["summary"])


def cmd_tasks_clear(api: Client, args: argparse.Namespace) -> Result:
    if not args.yes:
        raise UsageError(f"tasks clear deletes every task of {args.type!r}: add --yes to confirm")
    result = api.clear_type(args.type)
    return result, f"{result['deleted']} tasks of {args.type} deleted"


def cmd_queues(api: Client, args: argparse.Namespace) -> Result:
    if args.type:
        q = api.queues(args.type)
        return q, queue_rows([q])
    stats = api.queues()
    human = queue_rows(stats["queues"]) if stats["queues"] else "no task types yet"
    return stats, human


def cmd_dlq_ls(api: Client, args: argparse.Namespace) -> Result:
    page = api.dead_letters(args.type, args.before, args.limit)
    human = table(
        ["ENTRY_ID", "DEAD_AT", "TASK_ID", "ATTEMPTS", "REASON", "ERROR"],
        [
            [d["entry_id"], when(d["dead_ms"]), d.get("task_id"), d.get("attempts"),
             d.get("reason"), (d.get("error") or "")[:60]]
            for d in page["dead_letters"]
        ],
    )  # fmt: skip
    if page["next_cursor"]:
        human += f"\n(more: --before {page['next_cursor']})"
    return page, human


def cmd_dlq_show(api: Client, args: argparse.Namespace) -> Result:
    entry = api.dead_letter(args.type, args.entry_id)
    return entry, "\n".join(f"{k + ':':<14}{v}" for k, v in entry.items())


def cmd_dlq_replay(api: Client, args: argparse.Namespace) -> Result:
    if args.all == bool(args.entry_ids):
        raise UsageError("dlq replay: give entry ids or --all")
    result = api.replay(args.type, None if args.all else args.entry_ids)
    human = f"{result['replayed']} replayed, {result['missing']} missing, " + (
        f"{result['malformed']} malformed (kept)"
    )
    return result, human


def cmd_dlq_purge(api: Client, args: argparse.Namespace) -> Result:
    if args.all == bool(args.entry_ids):
        raise UsageError("dlq purge: give entry ids or --all")
    if args.all and not args.yes:
        raise UsageError(f"dlq purge --all deletes every dead letter of {args.type!r}: add --yes")
    result = api.purge(args.type, None if args.all else args.entry_ids)
    return result, f"{result['purged']} dead letters purged"


# -- parser -----------------------------------------------------------------------------


def cmd_migrate(args: argparse.Namespace) -> int:
    import trio

    from actors.domain.errors import LayoutMismatch
    from actors.store.migrate import migrate
    from runtime.config import RedisSection
    from runtime.errors import RedisUnavailable
    from runtime.redis_io import RedisClient

    if not 1 <= args.buckets <= MAX_BUCKETS:
        print(f"metronome: --buckets must be within 1..{MAX_BUCKETS}, got {args.buckets}",
              file=sys.stderr)  # fmt: skip
        return EXIT_USAGE

    async def run() -> int:
        settings = RedisSection(url=args.redis, cluster=args.cluster)
        client = RedisClient.from_settings(args.redis, settings)
        try:
            return await migrate(client, args.namespace, buckets=args.buckets)
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
    print(f"{args.namespace}: {moved} tasks migrated; the namespace is at the current layout")
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="metronome",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--url", default=os.environ.get("METRONOME_URL", DEFAULT_URL))
    parser.add_argument("--key-id", default=os.environ.get("METRONOME_KEY_ID"))
    parser.add_argument("--secret", default=os.environ.get("METRONOME_SECRET"),
                        help="prefer METRONOME_SECRET: flags show in process lists")  # fmt: skip
    parser.add_argument("--json", action="store_true", help="print the API's JSON answer")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds per request")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = commands.add_parser("serve", help="run a node (python -m runtime NODE_TOML)")
    serve.add_argument("node_args", nargs=argparse.REMAINDER, metavar="NODE_TOML [--check ...]")

    migrate = commands.add_parser(
        "migrate",
        help="convert a namespace an older Metronome wrote to this version's Redis layout "
        "(stop its nodes first; talks to Redis, not to the API)",
    )
    migrate.add_argument("--redis", required=True, metavar="URL", help="the namespace's Redis")
    migrate.add_argument("--namespace", default="metronome")
    migrate.add_argument("--buckets", type=int, default=DEFAULT_BUCKETS,
                         help="buckets per partition ([scheduler] buckets)")  # fmt: skip
    migrate.add_argument("--cluster", action="store_true", help="the Redis is a Redis Cluster")

    tasks = commands.add_parser("tasks", help="manage tasks").add_subparsers(
        dest="action", required=True, metavar="ACTION"
    )
    add = tasks.add_parser("add", help="create a task (or many with --file)")
    add.add_argument("--type", help="the task type (a [consumers.<type>] handles it)")
    add.add_argument("--id", help="your task id: makes the create idempotent")
    add.add_argument("--payload", help="JSON given to the handler (@file reads a file)")
    add.add_argument("--file", help="bulk: a JSON list or JSON lines of tasks ('-' = stdin)")
    add.add_argument("--batch", type=int, default=5000, help="tasks per bulk request")
    add_schedule_flags(add)
    add.set_defaults(run=cmd_tasks_add)
    for name, run, text in [
        ("get", cmd_tasks_get, "show one task"),
        ("pause", _simple("pause", "paused"), "pause a task"),
        ("resume", _simple("resume", "resumed"), "resume a paused task"),
        ("stop", _simple("stop", "stopped"), "stop a task for good"),
        ("rm", _simple("delete_task", "deleted"), "delete a task"),
        ("trigger", cmd_tasks_trigger, "run a task now, once"),
        ("explain", cmd_tasks_explain, "why is this task (not) running"),
    ]:
        sub = tasks.add_parser(name, help=text)
        sub.add_argument("task_id")
        sub.set_defaults(run=run)
    ls = tasks.add_parser("ls", help="list tasks")
    ls.add_argument("--type")
    ls.add_argument("--status", choices=STATUSES)
    ls.add_argument("--limit", type=int, default=100)
    ls.add_argument("--cursor")
    ls.add_argument("--all", action="store_true", help="follow the cursor to the end")
    ls.set_defaults(run=cmd_tasks_ls)
    update = tasks.add_parser("update", help="replace a task's payload and/or schedule")
    update.add_argument("task_id")
    update.add_argument("--payload", help="JSON (@file reads a file)")
    add_schedule_flags(update)
    update.set_defaults(run=cmd_tasks_update)
    clear = tasks.add_parser("clear", help="delete every task of a type")
    clear.add_argument("type")
    clear.add_argument("--yes", action="store_true")
    clear.set_defaults(run=cmd_tasks_clear)

    queues = commands.add_parser("queues", help="backlog per type")
    queues.add_argument("type", nargs="?")
    queues.set_defaults(run=cmd_queues)

    dlq = commands.add_parser("dlq", help="dead letters").add_subparsers(
        dest="action", required=True, metavar="ACTION"
    )
    dls = dlq.add_parser("ls", help="list dead letters of a type, newest first")
    dls.add_argument("type")
    dls.add_argument("--limit", type=int, default=50)
    dls.add_argument("--before", help="page cursor from the previous listing")
    dls.set_defaults(run=cmd_dlq_ls)
    show = dlq.add_parser("show", help="one dead letter")
    show.add_argument("type")
    show.add_argument("entry_id")
    show.set_defaults(run=cmd_dlq_show)
    for name, run in (("replay", cmd_dlq_replay), ("purge", cmd_dlq_purge)):
        sub = dlq.add_parser(name, help=f"{name} dead letters (ids, or --all)")
        sub.add_argument("type")
        sub.add_argument("entry_ids", nargs="*")
        sub.add_argument("--all", action="store_true")
        if name == "purge":
            sub.add_argument("--yes", action="store_true")
        sub.set_defaults(run=run)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "serve":
        from runtime.__main__ import main as serve

        return serve(args.node_args)
    if args.command == "migrate":
        return cmd_migrate(args)
    if not args.key_id or not args.secret:
        print("metronome: give --key-id and --secret (or METRONOME_KEY_ID, METRONOME_SECRET)",
              file=sys.stderr)  # fmt: skip
        return EXIT_USAGE
    try:
        with Client(args.url, args.key_id, args.secret, timeout_s=args.timeout) as api:
            data, human = args.run(api, args)
    except UsageError as exc:
        print(f"metronome: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ApiError as exc:
        if args.json:
            print(json.dumps({"status": exc.status, "code": exc.code, "detail": exc.detail,
                              "errors": exc.errors}))  # fmt: skip
        print(f"metronome: {exc}", file=sys.stderr)
        for error in exc.errors:
            print(f"  {error.get('field') or 'body'}: {error.get('message')}", file=sys.stderr)
        return exit_code(exc)
    except ApiUnavailable as exc:
        print(f"metronome: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    print(json.dumps(data, indent=2) if args.json else human)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
