"""``metronome tasks history``, ``metronome attention`` and ``metronome tasks acknowledge``:
a task's last occurrences, the tasks that need an operator, and taking one off that list
(``GET /v1/tasks/{task_id}/history``, ``GET /v1/attention``, ``POST
/v1/tasks/{task_id}/acknowledge``; docs/API.md).

    metronome tasks history daily -n 5
    metronome attention --type email --reason dead
    metronome tasks acknowledge daily --note "upstream outage, fixed"
"""

from __future__ import annotations

import argparse
from typing import Any

from actors.admin.calls import PAGE
from actors.admin.client import Client
from actors.admin.inputs import checked_name
from actors.admin.tables import table, when

REASONS = ("dead", "expired", "skipped", "late")


def _ms(a: int | None, b: int | None) -> str:
    return "" if a is None or b is None else str(b - a)


def cmd_tasks_history(api: Client, args: argparse.Namespace) -> tuple[Any, str]:
    answer = api.history(args.task_id, args.n)
    rows = [
        [
            when(o["due_ms"]),
            o["fate"] + (f" ({o['reason']})" if o["reason"] else ""),
            o["origin"],
            o["attempt"],
            _ms(o["due_ms"], o["started_ms"]),
            _ms(o["started_ms"], o["finished_ms"]),
            o["node"] or "",
            o["error"] or "",
        ]
        for o in answer["history"]
    ]
    if not rows:
        return answer, f"{args.task_id}: no occurrences recorded yet"
    headers = ["DUE (UTC)", "FATE", "ORIGIN", "ATTEMPT", "LATE_MS", "RAN_MS", "NODE", "ERROR"]
    return answer, table(headers, rows)


def cmd_attention(api: Client, args: argparse.Namespace) -> tuple[Any, str]:
    task_type = None if args.type is None else checked_name("type", args.type)
    items: list[dict[str, Any]] = []
    cursor = None
    while True:
        page = api.attention(task_type, args.reason, cursor, min(args.limit - len(items), PAGE))
        items += page["items"]
        cursor = page["cursor"]
        if cursor is None or len(items) >= args.limit:
            break
    answer = {"items": items[: args.limit], "cursor": cursor}
    rows = [
        [e["task_id"], e["type"], e["reason"], when(e["since_ms"]), when(e["due_ms"]),
         e["error"] or ""]
        for e in answer["items"]
    ]  # fmt: skip
    if not rows:
        return answer, "no task needs attention"
    shown = table(["TASK_ID", "TYPE", "REASON", "SINCE (UTC)", "DUE (UTC)", "ERROR"], rows)
    if cursor is not None:
        shown += "\n(more: raise --limit)"
    return answer, shown


def cmd_tasks_acknowledge(api: Client, args: argparse.Namespace) -> tuple[Any, str]:
    answer = api.acknowledge(args.task_id, args.note)
    if answer["acknowledged"]:
        return answer, f"{args.task_id} taken off the attention list ({answer['entry']['reason']})"
    return answer, f"{args.task_id} was not on the attention list"


def add_ledger_commands(commands: Any, tasks: Any) -> None:
    """``tasks history``, ``tasks acknowledge`` and the top-level ``attention``."""
    history = tasks.add_parser("history", help="the task's last occurrences, newest first")
    history.add_argument("task_id", help="the task's id")
    history.add_argument("-n", type=int, default=20, help="how many (default 20)")
    history.set_defaults(run=cmd_tasks_history)
    ack = tasks.add_parser("acknowledge", help="take the task off the attention list")
    ack.add_argument("task_id", help="the task's id")
    ack.add_argument("--note", help="why (up to 500 characters), kept with the task")
    ack.set_defaults(run=cmd_tasks_acknowledge)
    attention = commands.add_parser(
        "attention", help="tasks whose latest occurrence is dead, expired, skipped or late"
    )
    attention.add_argument("--type", help="only tasks of this type")
    attention.add_argument("--reason", choices=REASONS, help="only tasks there for this reason")
    attention.add_argument("--limit", type=int, default=100, help="at most this many (100)")
    attention.set_defaults(run=cmd_attention)
