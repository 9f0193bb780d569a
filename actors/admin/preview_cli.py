"""The CLI's previews: a task's upcoming fires (``metronome tasks upcoming ID``, from the
API) and a schedule's fires before any task has it (``metronome schedule preview``,
computed here by the same function the API and the poller use: no node needed).

    metronome tasks upcoming daily -n 5
    metronome schedule preview --cron '30 2 * * *' --tz Europe/Berlin \\
        --from 2026-03-28T00:00:00+01:00 -n 20
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from actors.admin.client import Client
from actors.admin.inputs import (
    InvalidArgument,
    UsageError,
    add_schedule_flags,
    checked_name,
    parse_time,
    schedule_from,
)
from actors.admin.tables import table, terminal_safe
from actors.domain.errors import InvalidTask
from actors.domain.model import MAX_TASK_ID, parse_schedule
from actors.domain.preview import MAX_PREVIEW, preview, rows
from actors.domain.schedules import Schedule, check_submitted

EXIT_OK, EXIT_USAGE, EXIT_INVALID = 0, 2, 5


def add_upcoming_parser(tasks: Any) -> None:
    """``tasks upcoming ID -n N`` under the ``tasks`` subcommands."""
    sub = tasks.add_parser("upcoming", help="the task's next fires, as the poller will run them")
    sub.add_argument("task_id", help="the task's id")
    sub.add_argument("-n", type=int, default=10, help=f"how many (1-{MAX_PREVIEW}; default 10)")
    sub.set_defaults(run=cmd_tasks_upcoming)


def add_schedule_parser(commands: Any) -> None:
    """``schedule preview``: local, no credentials."""
    schedule = commands.add_parser(
        "schedule", help="schedules without a task (local: no node needed)"
    ).add_subparsers(dest="action", required=True, metavar="ACTION")
    show = schedule.add_parser(
        "preview",
        help="the next fires of a schedule, in UTC and in its zone, with DST changes marked",
    )
    add_schedule_flags(show)
    show.add_argument("--from", dest="from_time", metavar="TIME",
                      help="as if the task were created then (ISO 8601 or Unix ms; "
                      "default now)")  # fmt: skip
    show.add_argument("-n", type=int, default=10, help=f"how many (1-{MAX_PREVIEW}; default 10)")
    show.add_argument("--id", help="a task id: resolves H cron fields and gives its spread")


def cmd_tasks_upcoming(api: Client, args: argparse.Namespace) -> tuple[Any, str]:
    _check_count(args.n)
    answer = api.upcoming(args.task_id, args.n)
    return answer, render(answer["fires"], answer["tz"], answer["notes"])


def render(fires: list[dict[str, Any]], tz: str, notes: list[str]) -> str:
    """Fires as a table (UTC, the schedule's zone, when enqueued, DST notes), then notes."""
    lines = [
        table(
            ["DUE (UTC)", f"LOCAL ({tz})", "ENQUEUED (UTC)", "DST"],
            [[f["due"], f["local"], f["fire"], f["note"] or ""] for f in fires],
        )
        if fires
        else "no upcoming fires"
    ]
    return "\n".join(lines + [f"note: {n}" for n in notes])


def run_schedule(args: argparse.Namespace) -> int:
    """``metronome schedule preview``: prints the answer, returns the exit status."""
    try:
        answer = schedule_preview(args)
    except UsageError as exc:
        print(f"metronome: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (InvalidArgument, InvalidTask, ValueError) as exc:
        print(f"metronome: {exc}", file=sys.stderr)
        return EXIT_INVALID
    if args.json:
        print(json.dumps(answer, indent=2))
    else:
        print(terminal_safe(render(answer["fires"], answer["tz"], answer["notes"])))
    return EXIT_OK


def schedule_preview(args: argparse.Namespace) -> dict[str, Any]:
    """The preview the flags ask for, as ``--json`` prints it."""
    _check_count(args.n)
    data = schedule_from(args, required=True)
    schedule = parse_schedule(data)
    check_submitted(schedule, 0.0)
    task_id = None if args.id is None else checked_name("--id", args.id, MAX_TASK_ID)
    from_ms = (
        int(time.time() * 1000) if args.from_time is None else parse_time(args.from_time, "--from")
    )
    fires = preview(schedule, from_ms, args.n, task_id)
    grid = schedule if task_id is None else schedule.for_task(task_id)
    return {
        "schedule": grid.to_dict(),
        "from_ms": from_ms,
        "tz": schedule.tz,
        "task_id": task_id,
        "offset_ms": None if task_id is None else grid.offset_ms(task_id),
        "fires": rows(grid, fires, from_ms),
        "notes": _notes(schedule, grid, task_id, len(fires), args.n),
    }


def _notes(
    given: Schedule, schedule: Schedule, task_id: str | None, count: int, n: int
) -> list[str]:
    """What the table leaves out: the cron as a task would store it (H resolved), the
    spread (known only with a task id), the jitter, an early end."""
    notes = []
    if schedule is not given:
        notes.append(f"cron as stored for task {task_id}: {schedule.cron!r}")
    if schedule.spread_s and task_id is None:
        notes.append("spread_s is chosen from the task id: give --id to see it (here: none)")
    elif schedule.spread_s and task_id is not None:
        notes.append(f"spread: every fire enqueued {schedule.offset_ms(task_id) / 1000:g}s late")
    if schedule.jitter_s:
        notes.append(f"each fire is also delayed by a random jitter up to {schedule.jitter_s:g}s")
    if count < n:
        notes.append(f"the schedule ends after {count} fire(s)")
    return notes


def _check_count(n: int) -> None:
    if not 1 <= n <= MAX_PREVIEW:
        raise UsageError(f"-n: must be within 1..{MAX_PREVIEW}, got {n}")
