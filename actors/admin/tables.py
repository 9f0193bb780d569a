"""How the ``metronome`` CLI shows the API's answers as tables and text."""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Sequence
from typing import Any

from actors.store.notes import describe_note

#: C0 controls but newline and tab, DEL and the C1 controls (a terminal may take U+009B
#: for an escape sequence's start).
_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def terminal_safe(text: str) -> str:
    """``text`` with its control characters written out (``\\x1b``): what the CLI prints
    comes from handlers, payloads and stored records (a handler's error message quoting
    its input), and read raw by a terminal an escape sequence clears the screen, moves the
    cursor over earlier lines or sets the window title."""
    return _CONTROLS.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def when(ms: int | None) -> str:
    if ms is None:
        return "-"
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


def seconds(ms: int | None) -> str:
    return "-" if ms is None else f"{ms / 1000:.1f}s"


def schedule_text(schedule: dict[str, Any]) -> str:
    kind = schedule.get("kind")
    if kind == "interval":
        return f"every {schedule.get('every_s')}s"
    if kind == "cron":
        return f"cron {schedule.get('cron')} {schedule.get('tz', 'UTC')}"
    return f"once {when(schedule.get('at_ms'))}"


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(c) for c in headers]] + [["-" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    )


def show_task(task: dict[str, Any]) -> str:
    lines = [
        ("task_id", task["task_id"]),
        ("type", task["type"]),
        ("status", task["status"]),
        ("schedule", schedule_text(task["schedule"])),
        ("next run", when(task["next_run_ms"])),
        ("fires / runs / retries", f"{task['fires']} / {task['runs']} / {task['retries']}"),
        ("last run", f"{when(task['last_run_ms'])} {task['last_status'] or ''}".strip()),
        ("last error", task["last_error"] or "-"),
        ("payload", json.dumps(task["payload"])),
    ]
    if task.get("labels"):
        lines.append(("labels", ", ".join(f"{k}={v}" for k, v in task["labels"].items())))
    if task.get("note"):
        lines.append(("note", describe_note(task["note"])))
    return "\n".join(f"{k + ':':<24}{v}" for k, v in lines)


def task_rows(tasks: list[dict[str, Any]]) -> str:
    return table(
        ["TASK_ID", "TYPE", "STATUS", "SCHEDULE", "NEXT_RUN", "RUNS", "LAST"],
        [
            [t["task_id"], t["type"], t["status"], schedule_text(t["schedule"]),
             when(t["next_run_ms"]), t["runs"], t["last_status"]]
            for t in tasks
        ],
    )  # fmt: skip


def queue_rows(queues: list[dict[str, Any]]) -> str:
    return table(
        ["TYPE", "LENGTH", "UNDELIVERED", "PENDING", "OLDEST_PENDING", "CONSUMERS", "RETRYING",
         "DLQ"],
        [
            [q["type"], q["length"], q["undelivered"], q["pending"],
             seconds(q["oldest_pending_age_ms"]),
             len(q["consumers"]), q["retrying"], q["dead_letters"]]
            for q in queues
        ],
    )  # fmt: skip


def partition_rows(view: dict[str, Any]) -> str:
    now = view["now_ms"]
    return table(
        ["PARTITION", "POLLER", "LEASE", "IN_FLIGHT", "DUE_NOW", "NEXT_DUE"],
        [
            [p["partition"], p["poller"] or "-",
             (f"{seconds(p['lease_until_ms'] - now)} left" if p["live"] else "expired")
             if p["lease_until_ms"] is not None else "free",
             p["claims_in_flight"], p["due_now"], when(p["next_due_ms"])]
            for p in view["partitions"]
        ],
    )  # fmt: skip


# -- schedule flags ---------------------------------------------------------------------
