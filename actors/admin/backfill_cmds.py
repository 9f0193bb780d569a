"""``metronome tasks backfill`` and ``metronome backfill``: run the grid times of a past
window, of one task or of every active or paused task of a type (``POST
/v1/tasks/{task_id}/backfill``, ``POST /v1/backfill``; docs/API.md).

    metronome tasks backfill daily --from 2025-03-01T00:00:00Z --to 2025-03-08T00:00:00Z
    metronome backfill --type report --from 1740787200000 --to 1741392000000 --dry-run
"""

from __future__ import annotations

import argparse
import typing
from typing import Any

from actors.admin.action_cmds import add_selector_flags, run_action, selected
from actors.admin.client import Client
from actors.admin.exits import Result
from actors.admin.inputs import checked_name, parse_time
from actors.admin.tables import table, when
from actors.domain.schedules import Overlap


def _window(args: argparse.Namespace) -> tuple[int, int]:
    return parse_time(args.start, "--from"), parse_time(args.end, "--to")


def _summary(answer: dict[str, Any], fires: int) -> str:
    already = answer["already_backfilled"]
    if answer["dry_run"]:
        return (
            f"{fires} fires in the window (dry run, nothing enqueued): {fires - already} "
            f"would be enqueued, {already} already backfilled"
        )
    held, skipped = answer.get("held_back", 0), answer.get("skipped", 0)
    return (
        f"{fires} fires in the window: {answer['enqueued']} enqueued, {already} already backfilled"
        + (f", {held} waiting behind the fire in flight" if held else "")
        + (f", {skipped} skipped by the overlap policy (not run)" if skipped else "")
    )


def cmd_tasks_backfill(api: Client, args: argparse.Namespace) -> Result:
    start, end = _window(args)
    if selected(args):
        return run_action(api, args, overlap=args.overlap, start_ms=start, end_ms=end)
    answer = api.backfill(args.task_id, start, end, overlap=args.overlap, dry_run=args.dry_run)
    rows = [[when(f["due_ms"]), f["due_ms"], f["schedule_id"]] for f in answer["fires"]]
    shown = table(["DUE (UTC)", "DUE_MS", "SCHEDULE_ID"], rows) + "\n" if rows else ""
    return answer, shown + _summary(answer, len(answer["fires"]))


def cmd_backfill(api: Client, args: argparse.Namespace) -> tuple[Any, str]:
    start, end = _window(args)
    task_type = checked_name("type", args.type)
    answer = api.backfill_type(task_type, start, end, dry_run=args.dry_run)
    rows = [
        [t["task_id"], t["fires"], t["enqueued"], t["already_backfilled"]] for t in answer["tasks"]
    ]
    shown = table(["TASK_ID", "FIRES", "ENQUEUED", "ALREADY"], rows) + "\n" if rows else ""
    tasks = f"{len(rows)} tasks of {task_type} with fires in the window; "
    return answer, shown + tasks + _summary(answer, answer["fires"])


def _window_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--from",
        dest="start",
        required=True,
        metavar="TIME",
        help="window start, inclusive (ISO 8601 with an offset, or Unix ms)",
    )
    parser.add_argument(
        "--to",
        dest="end",
        required=True,
        metavar="TIME",
        help="window end, exclusive, not in the future (ISO 8601 or Unix ms)",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        dest="dry_run",
        help="enqueue nothing: show the fires and what is already backfilled",
    )


def add_backfill_commands(commands: Any, tasks: Any) -> None:
    """The two commands, under ``metronome tasks`` and ``metronome``."""
    one = tasks.add_parser(
        "backfill",
        help="run a task's grid times of a past window (each once, however often repeated)",
    )
    one.add_argument("task_id", nargs="?", help="the task's id (or --selector)")
    _window_flags(one)
    add_selector_flags(one, dry_run=False)
    one.add_argument("--overlap", choices=typing.get_args(Overlap),
                     help="the policy the fires run under (default: the task's own)")  # fmt: skip
    one.set_defaults(run=cmd_tasks_backfill)
    every = commands.add_parser(
        "backfill", help="backfill a past window of every active or paused task of a type"
    )
    every.add_argument("--type", required=True, help="the task type")
    _window_flags(every)
    every.set_defaults(run=cmd_backfill)
