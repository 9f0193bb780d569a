"""``metronome``: the admin CLI. Talks to a node's API with signed requests.

    metronome tasks add --type report --cron "0 9 * * 1-5" --tz Europe/Paris --id daily
    metronome tasks explain daily
    metronome tasks upcoming daily -n 5       # the next fires, as they will run
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
definition, or a transition not allowed); 5 invalid input; 6 not authenticated or not
allowed; 7 the API (for migrate: Redis) is unreachable or unavailable; 1 anything else.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import typing
from collections.abc import Callable
from typing import Any

from actors.admin.backfill_cmds import add_backfill_commands
from actors.admin.client import ApiError, ApiUnavailable, Client
from actors.admin.inputs import (
    InvalidArgument,
    UsageError,
    add_label_flag,
    add_list_filter_flags,
    add_schedule_flags,
    checked_name,
    labels_from,
    list_filters,
    modifiers_only,
    payload_from,
    read_text,
    schedule_from,
    tasks_from,
)
from actors.admin.preview_cli import add_schedule_parser, add_upcoming_parser, run_schedule
from actors.admin.tables import partition_rows, queue_rows, show_task, table, task_rows, when
from actors.domain.model import MAX_TASK_ID, STATUSES
from actors.domain.schedules import Overlap
from actors.store.keys import DEFAULT_BUCKETS, MAX_BUCKETS
from runtime.version import __version__

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

Result = tuple[Any, str] | tuple[Any, str, int]
"""(the API's JSON answer, its human rendering[, the exit status when not 0])."""


def cmd_tasks_add(api: Client, args: argparse.Namespace) -> Result:
    if args.file is not None:
        tasks = tasks_from(read_text(args.file, "--file"), args.file)
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
    task_id = None if args.id is None else checked_name("--id", args.id, MAX_TASK_ID)
    labels = labels_from(args.labels)
    result = api.create_task(args.type, schedule, payload_from(args.payload), task_id, labels)
    verb = "created" if result["created"] else "already exists (same definition)"
    return result, f"{result['task_id']} {verb}"


def cmd_tasks_get(api: Client, args: argparse.Namespace) -> Result:
    task = api.get_task(args.task_id)
    return task, show_task(task)


def cmd_tasks_ls(api: Client, args: argparse.Namespace) -> Result:
    filters = list_filters(args)
    if args.all:
        tasks = list(api.iter_tasks(args.type, args.status, **filters))
        return {"tasks": tasks, "next_cursor": None}, task_rows(tasks)
    page = api.list_tasks(args.type, args.status, args.cursor, args.limit, **filters)
    human = task_rows(page["tasks"])
    if page["next_cursor"]:
        human += f"\n(more: --cursor {page['next_cursor']}, or --all)"
    return page, human


def cmd_tasks_update(api: Client, args: argparse.Namespace) -> Result:
    changes: dict[str, Any] = {}
    current = None
    if modifiers_only(args):  # --jitter, --end ... alone change the current schedule
        current = api.get_task(args.task_id)["schedule"]
    schedule = schedule_from(args, required=False, base=current)
    if schedule is not None:
        changes["schedule"] = schedule
    if args.payload is not None:
        changes["payload"] = payload_from(args.payload)
    if args.labels or args.no_labels:
        changes["labels"] = labels_from(args.labels)
    if not changes:
        raise UsageError("tasks update: give --payload, --label and/or a schedule")
    result = api.update_task(args.task_id, **changes)
    return result, f"{result['task_id']} updated ({result['status']})"


def _simple(action: str, verb: str) -> Callable[[Client, argparse.Namespace], Result]:
    def command(api: Client, args: argparse.Namespace) -> Result:
        note = {"note": args.note} if getattr(args, "note", None) is not None else {}
        result: dict[str, Any] = getattr(api, action)(args.task_id, **note)
        return result, f"{args.task_id} {verb}" + (
            f" ({result['status']})" if "status" in result else ""
        )

    return command


def cmd_tasks_trigger(api: Client, args: argparse.Namespace) -> Result:
    result = api.trigger(args.task_id, args.overlap)
    if not result.get("queued", True):
        return (
            result,
            f"{args.task_id} triggered: fire {result['schedule_id']} not queued now "
            f"(overlap {args.overlap}: it waits or was skipped)",
        )
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
    if args.words[:1] == ["purge"]:
        if len(args.words) != 2:
            raise UsageError("queues purge: give one type: metronome queues purge TYPE --yes")
        task_type = checked_name("type", args.words[1])
        if not args.yes:
            raise UsageError(
                f"queues purge deletes every undelivered message of {task_type!r} (their "
                "fires do not run): add --yes to confirm"
            )
        result = api.purge_queue(task_type)
        return result, f"{result['purged']} undelivered messages of {task_type} purged"
    if len(args.words) > 1:
        raise UsageError("queues: give at most one type (or: queues purge TYPE --yes)")
    if args.words:
        q = api.queues(checked_name("type", args.words[0]))
        return q, queue_rows([q])
    stats = api.queues()
    human = queue_rows(stats["queues"]) if stats["queues"] else "no task types yet"
    return stats, human


def cmd_partitions(api: Client, _args: argparse.Namespace) -> Result:
    view = api.partitions()
    pollers = ", ".join(view["pollers"]) or "none"
    return view, f"live pollers: {pollers}\n{partition_rows(view)}"


def cmd_dlq_ls(api: Client, args: argparse.Namespace) -> Result:
    page = api.dead_letters(args.type, args.before, args.limit)
    human = table(
        ["ENTRY_ID", "DEAD_AT", "TASK_ID", "ATTEMPTS", "REASON", "ERROR"],
        [
            [d["entry_id"], when(d["dead_ms"]), d.get("task_id"), d.get("attempts"),
             d.get("reason"), (d.get("error_line") or d.get("error") or "")[:80]]
            for d in page["dead_letters"]
        ],
    )  # fmt: skip
    if page["next_cursor"]:
        human += f"\n(more: --before {page['next_cursor']})"
    return page, human


def cmd_dlq_show(api: Client, args: argparse.Namespace) -> Result:
    entry = api.dead_letter(args.type, args.entry_id)
    shown = {k: v for k, v in entry.items() if k not in ("error", "error_line")}
    shown["error"] = entry.get("error_line") or entry.get("error")
    human = "\n".join(f"{k + ':':<14}{v}" for k, v in shown.items())
    if args.traceback and entry.get("error"):
        human += "\ntraceback:\n" + "\n".join(
            f"    {line}" for line in str(entry["error"]).splitlines()
        )
    elif entry.get("error", "").startswith("Traceback"):
        human += "\n(--traceback shows where it was raised)"
    return entry, human


def cmd_dlq_replay(api: Client, args: argparse.Namespace) -> Result:
    if args.all == bool(args.entry_ids):
        raise UsageError("dlq replay: give entry ids or --all")
    result = api.replay(args.type, None if args.all else args.entry_ids)
    human = f"{result['replayed']} replayed, {result['missing']} missing, " + (
        f"{result['malformed']} malformed (kept)"
    )
    if result["missing"] or result["malformed"]:
        return result, human, EXIT_NOT_FOUND if result["missing"] else EXIT_OTHER
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
    print(
        f"{args.namespace}: {moved} tasks migrated; the namespace is at the current layout, "
        "with compact messages (nodes of this version write them from their next start)"
    )
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="metronome",
        description=__doc__.split("\n", 1)[1].replace("``", ""),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
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
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds per request")
    parser.add_argument("--debug", action="store_true",
                        help="show the traceback of an unexpected error")  # fmt: skip
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

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

    tasks = commands.add_parser("tasks", help="manage tasks").add_subparsers(
        dest="action", required=True, metavar="ACTION"
    )
    add = tasks.add_parser("add", help="create a task (or many with --file)")
    add.add_argument("--type", help="the task type (a [consumers.<type>] handles it)")
    add.add_argument("--id", help="your task id: makes the create idempotent")
    add.add_argument("--payload", help="JSON given to the handler (@file reads a file)")
    add.add_argument("--file", help="bulk: a JSON list or JSON lines of tasks ('-' = stdin)")
    add.add_argument("--batch", type=int, default=5000,
                     help="tasks per bulk request (at most the node's [api] max_bulk)")  # fmt: skip
    add_label_flag(add, "a label to find the task by (repeatable)")
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
        sub.add_argument("task_id", help="the task's id")
        if name in ("pause", "resume"):
            sub.add_argument("--note", help="why (up to 500 characters), kept with the task")
        if name == "trigger":
            sub.add_argument(
                "--overlap", choices=typing.get_args(Overlap),
                help="the policy this fire runs under (default allow_all)",
            )  # fmt: skip
        sub.set_defaults(run=run)
    add_upcoming_parser(tasks)
    ls = tasks.add_parser("ls", help="list tasks")
    ls.add_argument("--type", help="only tasks of this type")
    ls.add_argument("--status", choices=STATUSES, help="only tasks in this status")
    add_list_filter_flags(ls)
    ls.add_argument("--limit", type=int, default=100, help="tasks per page (1-1000)")
    ls.add_argument("--cursor", help="page cursor from the previous listing")
    ls.add_argument("--all", action="store_true", help="follow the cursor to the end")
    ls.set_defaults(run=cmd_tasks_ls)
    update = tasks.add_parser("update", help="replace a task's payload, schedule and/or labels")
    update.add_argument("task_id", help="the task's id")
    update.add_argument("--payload", help="JSON (@file reads a file)")
    add_label_flag(update, "the task's labels: these replace all it had (repeatable)")
    update.add_argument("--no-labels", action="store_true", help="remove all its labels")
    add_schedule_flags(update)
    update.set_defaults(run=cmd_tasks_update)
    clear = tasks.add_parser("clear", help="delete every task of a type")
    clear.add_argument("type", help="the task type")
    clear.add_argument("--yes", action="store_true", help="confirm: this cannot be undone")
    clear.set_defaults(run=cmd_tasks_clear)

    add_backfill_commands(commands, tasks)

    queues = commands.add_parser(
        "queues",
        help="backlog per type; 'queues TYPE' for one, 'queues purge TYPE --yes' deletes "
        "its undelivered messages",
    )
    queues.add_argument("words", nargs="*", metavar="[purge] TYPE", help="a type, or purge TYPE")
    queues.add_argument("--yes", action="store_true", help="confirm a purge")
    queues.set_defaults(run=cmd_queues)

    partitions = commands.add_parser(
        "partitions", help="which poller serves each partition, and what is due in it"
    )
    partitions.set_defaults(run=cmd_partitions)
    add_schedule_parser(commands)
    dlq = commands.add_parser("dlq", help="dead letters").add_subparsers(
        dest="action", required=True, metavar="ACTION"
    )
    dls = dlq.add_parser("ls", help="list dead letters of a type, newest first")
    dls.add_argument("type", help="the task type")
    dls.add_argument("--limit", type=int, default=50, help="entries per page (1-1000)")
    dls.add_argument("--before", help="page cursor from the previous listing")
    dls.set_defaults(run=cmd_dlq_ls)
    show = dlq.add_parser("show", help="one dead letter")
    show.add_argument("type", help="the task type")
    show.add_argument("entry_id", help="the dead letter's entry id (from dlq ls)")
    show.add_argument("--traceback", action="store_true", help="also print the traceback")
    show.set_defaults(run=cmd_dlq_show)
    for name, run in (("replay", cmd_dlq_replay), ("purge", cmd_dlq_purge)):
        sub = dlq.add_parser(name, help=f"{name} dead letters (ids, or --all)")
        sub.add_argument("type", help="the task type")
        sub.add_argument("entry_ids", nargs="*", help="dead letter entry ids (from dlq ls)")
        sub.add_argument("--all", action="store_true", help="every dead letter of the type")
        if name == "purge":
            sub.add_argument("--yes", action="store_true", help="confirm purging --all")
        sub.set_defaults(run=run)
    return parser


def _check_arguments(args: argparse.Namespace) -> None:
    """Ids and types are checked here: one like ``a/b`` would reach no endpoint at all."""
    if getattr(args, "task_id", None) is not None:
        checked_name("task id", args.task_id, MAX_TASK_ID)
    if getattr(args, "command", None) in ("tasks", "dlq") and getattr(args, "type", None):
        checked_name("type", args.type)


def _serve(node_args: list[str]) -> int:
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
        print(f"metronome: {exc.detail} ({exc.status} {exc.code})", file=sys.stderr)
        return exit_code(exc)
    except ApiUnavailable as exc:
        print(f"metronome: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    print(json.dumps(data, indent=2) if args.json else human)
    if status and status[0] != EXIT_OK:  # done in part: say so where errors go
        print(f"metronome: {human.splitlines()[0]}", file=sys.stderr)
        return int(status[0])
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    """The console script. Exit statuses: the module docstring."""
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        return _serve(args.node_args)
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
