"""``metronome tasks ...``: create, show, list, update, pause, resume, stop, delete,
trigger, explain and clear tasks, through the signing client. Pause, resume, stop, rm and
trigger also take ``--selector`` instead of a task id (``actors.admin.action_cmds``)."""

from __future__ import annotations

import argparse
import re
import typing
from collections.abc import Callable
from typing import Any

from actors.admin.action_cmds import ACTIONS, add_selector_flags, run_action, selected
from actors.admin.calls import ApiError
from actors.admin.client import Client
from actors.admin.exits import EXIT_CONFLICT, Result
from actors.admin.inputs import (
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
    schedule_flags_given,
    schedule_from,
    tasks_from,
)
from actors.admin.preview_cli import add_upcoming_parser
from actors.admin.tables import show_task, task_rows
from actors.domain.model import MAX_TASK_ID, STATUSES
from actors.domain.schedules import Overlap


def cmd_tasks_add(api: Client, args: argparse.Namespace) -> Result:
    if args.file is not None:
        given = [
            flag
            for flag, value in (("--type", args.type), ("--id", args.id),
                                ("--payload", args.payload), ("--label", args.labels or None))
            if value is not None
        ] + schedule_flags_given(args)  # fmt: skip
        if given:  # each task of the file says its own: these would be ignored
            raise UsageError(
                f"tasks add: --file takes no {', '.join(given)} (each task in it says its own)"
            )
        if args.batch < 1:
            raise UsageError(f"--batch: must be at least 1, got {args.batch}")
        tasks = tasks_from(read_text(args.file, "--file"), args.file)
        created: dict[str, Any] = {"created": 0, "existing": 0, "conflicts": 0, "results": []}
        for i in range(0, len(tasks), args.batch):
            try:
                part = api.create_tasks(tasks[i : i + args.batch])
            except ApiError as exc:
                raise _in_file(exc, i, created) from None
            for key in ("created", "existing", "conflicts"):
                created[key] += part[key]
            created["results"] += part["results"]
        human = (
            f"{created['created']} created, {created['existing']} already existed, "
            f"{created['conflicts']} conflicts"
        )
        if created["conflicts"]:  # as one task's conflict: exists with another definition
            return created, human, EXIT_CONFLICT
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


def _in_file(error: ApiError, first: int, done: dict[str, Any]) -> ApiError:
    """A bulk request's refusal as the file's: its items numbered from the file's start,
    and what the requests before it did (they went through: a fix and a rerun of the
    whole file finds the tasks with an id there, and creates again those without)."""

    def renumbered(text: Any) -> Any:
        if not isinstance(text, str):
            return text
        return re.sub(r"tasks\[(\d+)\]", lambda m: f"tasks[{first + int(m[1])}]", text)

    errors = [
        {k: renumbered(v) if k in ("field", "message") else v for k, v in e.items()}
        if isinstance(e, dict) else e
        for e in (error.errors if isinstance(error.errors, list) else [])
    ]  # fmt: skip
    detail = renumbered(error.detail)
    if first:
        detail += (
            f" (tasks 0..{first - 1} of the file were sent before: {done['created']} created, "
            f"{done['existing']} already existed, {done['conflicts']} conflicts)"
        )
    return ApiError(error.status, error.code, detail, errors)


def cmd_tasks_get(api: Client, args: argparse.Namespace) -> Result:
    task = api.get_task(args.task_id)
    return task, show_task(task)


def cmd_tasks_ls(api: Client, args: argparse.Namespace) -> Result:
    filters = list_filters(args)
    if args.all and args.cursor is not None:
        raise UsageError("tasks ls: --all lists from the start: give --all or --cursor")
    if args.all:
        unreadable: list[dict[str, str]] = []
        tasks = list(api.iter_tasks(args.type, args.status, unreadable, **filters))
        page: dict[str, Any] = {"tasks": tasks, "next_cursor": None}
        if unreadable:
            page["unreadable"] = unreadable
    else:
        page = api.list_tasks(args.type, args.status, args.cursor, args.limit, **filters)
    human = task_rows(page["tasks"])
    for item in page.get("unreadable", []):  # left out of the rows: named, with why
        human += f"\nunreadable: {item['task_id']}: {item['error']}"
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
    if args.labels and args.no_labels:
        raise UsageError("tasks update: give --label or --no-labels, not both")
    if args.labels or args.no_labels:
        changes["labels"] = labels_from(args.labels)
    if not changes:
        raise UsageError("tasks update: give --payload, --label and/or a schedule")
    result = api.update_task(args.task_id, **changes)
    return result, f"{result['task_id']} updated ({result['status']})"


def _simple(action: str, verb: str) -> Callable[[Client, argparse.Namespace], Result]:
    def command(api: Client, args: argparse.Namespace) -> Result:
        note = {"note": args.note} if getattr(args, "note", None) is not None else {}
        if args.action != "get" and selected(args):
            return run_action(api, args, **note)
        result: dict[str, Any] = getattr(api, action)(args.task_id, **note)
        return result, f"{args.task_id} {verb}" + (
            f" ({result['status']})" if "status" in result else ""
        )

    return command


def cmd_tasks_trigger(api: Client, args: argparse.Namespace) -> Result:
    if selected(args):
        return run_action(api, args, overlap=args.overlap)
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


def add_task_commands(commands: Any) -> Any:
    """``metronome tasks ...``: the task operations; returns the ``tasks`` subparsers so
    other command groups (backfill) can add theirs."""
    tasks = commands.add_parser("tasks", help="manage tasks").add_subparsers(
        dest="action", required=True, metavar="ACTION"
    )
    _add_create_parser(tasks)
    _add_one_task_parsers(tasks)
    add_upcoming_parser(tasks)
    _add_list_parser(tasks)
    _add_update_parser(tasks)
    clear = tasks.add_parser("clear", help="delete every task of a type")
    clear.add_argument("type", help="the task type")
    clear.add_argument("--yes", action="store_true", help="confirm: this cannot be undone")
    clear.set_defaults(run=cmd_tasks_clear)
    return tasks


def _add_create_parser(tasks: Any) -> None:
    """``tasks add``: one task from flags, or many from a file."""
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


def _add_one_task_parsers(tasks: Any) -> None:
    """The commands that name one task by id: get, pause, resume, stop, rm, trigger,
    explain."""
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
        if name in ACTIONS:  # one task, or every task a selector matches
            sub.add_argument("task_id", nargs="?", help="the task's id (or --selector)")
            add_selector_flags(sub)
        else:
            sub.add_argument("task_id", help="the task's id")
        if name in ("pause", "resume"):
            sub.add_argument("--note", help="why (up to 500 characters), kept with the task")
        if name == "trigger":
            sub.add_argument(
                "--overlap", choices=typing.get_args(Overlap),
                help="the policy this fire runs under (default allow_all)",
            )  # fmt: skip
        sub.set_defaults(run=run)


def _add_list_parser(tasks: Any) -> None:
    """``tasks ls``: a page of tasks, filtered, or every page with ``--all``."""
    ls = tasks.add_parser("ls", help="list tasks")
    ls.add_argument("--type", help="only tasks of this type")
    ls.add_argument("--status", choices=STATUSES, help="only tasks in this status")
    add_list_filter_flags(ls)
    ls.add_argument("--limit", type=int, default=100, help="tasks per page (1-1000)")
    ls.add_argument("--cursor", help="page cursor from the previous listing")
    ls.add_argument("--all", action="store_true", help="follow the cursor to the end")
    ls.set_defaults(run=cmd_tasks_ls)


def _add_update_parser(tasks: Any) -> None:
    """``tasks update``: a task's payload, schedule and/or labels replaced."""
    update = tasks.add_parser("update", help="replace a task's payload, schedule and/or labels")
    update.add_argument("task_id", help="the task's id")
    update.add_argument("--payload", help="JSON (@file reads a file)")
    add_label_flag(update, "the task's labels: these replace all it had (repeatable)")
    update.add_argument("--no-labels", action="store_true", help="remove all its labels")
    add_schedule_flags(update)
    update.set_defaults(run=cmd_tasks_update)
