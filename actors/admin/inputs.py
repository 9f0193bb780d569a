"""How the ``metronome`` CLI reads what a user types: schedule flags, times, payloads."""

from __future__ import annotations

import argparse
import datetime as dt
import math
import sys
import typing
from pathlib import Path
from typing import Any

from actors.domain.errors import InvalidTask
from actors.domain.labels import parse_label_filters
from actors.domain.model import decode_json
from actors.domain.schedules import MAX_MS, Misfire, Overlap
from actors.store.history import FATE_NAMES
from actors.store.records import OUTCOME_NAMES
from runtime.config import check_name


class UsageError(Exception):
    """A command line that cannot be run as given: one line on stderr, exit 2."""


class InvalidArgument(Exception):
    """A value the API would refuse (an id it cannot even route): one line, exit 5."""


def checked_name(what: str, value: str, max_len: int = 64) -> str:
    """A task id or type as the API accepts it, or InvalidArgument saying why."""
    try:
        return check_name(what, value, max_len)
    except ValueError as exc:
        raise InvalidArgument(str(exc)) from None


def add_label_flag(parser: argparse.ArgumentParser, text: str) -> None:
    parser.add_argument(
        "--label", action="append", default=[], metavar="KEY=VALUE", dest="labels", help=text
    )


def labels_from(values: list[str]) -> dict[str, str]:
    """``--label k=v`` flags as labels, or InvalidArgument saying why."""
    try:
        return parse_label_filters(values, "--label")
    except InvalidTask as exc:
        raise InvalidArgument(str(exc)) from None


def add_list_filter_flags(parser: argparse.ArgumentParser) -> None:
    """``tasks ls``'s filters beyond type and status (``list_filters`` reads them)."""
    add_label_flag(parser, "only tasks with this label (repeatable: every one must match)")
    parser.add_argument("--next-before", metavar="TIME",
                        help="only tasks next due at or before (ISO 8601 or Unix ms)")  # fmt: skip
    parser.add_argument("--last-status", choices=OUTCOME_NAMES,
                        help="only tasks whose last run ended so")  # fmt: skip
    parser.add_argument("--last-fate", choices=FATE_NAMES,
                        help="only tasks whose latest occurrence was so")  # fmt: skip


def list_filters(args: argparse.Namespace) -> dict[str, Any]:
    """The ``Client.list_tasks`` filters of ``add_list_filter_flags``'s flags."""
    before = args.next_before
    return {
        "labels": labels_from(args.labels),
        "next_before": None if before is None else parse_time(before, "--next-before"),
        "last_status": args.last_status,
        "last_fate": args.last_fate,
    }


def read_text(path: str, flag: str) -> str:
    """A file's text (``-`` = standard input), or UsageError naming the flag and why."""
    if path == "-":
        return sys.stdin.read()
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise UsageError(f"{flag}: cannot read {path!r}: {reason}") from None


def tasks_from(text: str, source: str) -> list[Any]:
    """Tasks from a JSON list, or JSON lines (errors name the line of the file)."""
    if text.lstrip().startswith("["):
        try:
            tasks = decode_json(text)
        except ValueError as exc:
            raise UsageError(f"{source}: not a JSON list: {exc}") from None
        if not isinstance(tasks, list):
            raise UsageError(f"{source}: not a JSON list")
        return tasks
    out = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            out.append(decode_json(line))
        except ValueError as exc:
            message = getattr(exc, "msg", str(exc))
            column = getattr(exc, "colno", None)
            where = f"line {number}" + (f" column {column}" if column else "")
            raise UsageError(f"{source}: {where}: not JSON: {message}") from None
    return out


def finite(text: str) -> float:
    """A flag's number (``argparse`` type): ``nan`` and ``inf`` are no number of seconds,
    said as the flag's error (sent on, they read as JSON the API refuses, or fail here)."""
    value = float(text)  # a ValueError: argparse says "invalid finite value"
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value


def seconds(text: str) -> float:
    """A flag's positive, finite number of seconds (``argparse`` type)."""
    value = finite(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be more than 0 seconds, got {text!r}")
    return value


def add_schedule_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("schedule (one of --every, --cron, --at)")
    group.add_argument("--every", type=finite, metavar="SECONDS", help="fire every N seconds")
    group.add_argument(
        "--cron",
        metavar="EXPR",
        help="five-field cron expression; H in the minute or hour: chosen from the task id",
    )
    group.add_argument("--tz", help="time zone of --cron (default UTC)")
    group.add_argument("--at", metavar="TIME", help="once, at an ISO 8601 time or Unix ms")
    group.add_argument("--jitter", type=finite, metavar="SECONDS", help="random delay up to N s")
    group.add_argument("--start", metavar="TIME", help="no fires before (ISO 8601 or Unix ms)")
    group.add_argument("--end", metavar="TIME", help="no fires after (ISO 8601 or Unix ms)")
    group.add_argument("--max-runs", type=int, metavar="N", help="finish after N fires")
    group.add_argument("--misfire", choices=typing.get_args(Misfire),
                       help="fires missed while nothing ran: run one (coalesce), none (skip) "
                       "or each (fire_all)")  # fmt: skip
    group.add_argument("--overlap", choices=typing.get_args(Overlap),
                       help="a fire due while one is in flight: runs too (allow_all), is not "
                       "run (skip), waits (buffer_one, buffer_all) or replaces it "
                       "(cancel_other)")  # fmt: skip
    group.add_argument(
        "--catchup-window",
        type=finite,
        metavar="SECONDS",
        dest="catchup_window",
        help="a fire more than N s late is not run (expired)",
    )
    group.add_argument(
        "--spread",
        type=finite,
        metavar="SECONDS",
        help="move every fire by a fixed offset below N s, chosen from the id",
    )
    group.add_argument(
        "--pause-after-failures",
        type=int,
        metavar="N",
        dest="pause_after_failures",
        help="pause the task after N fires in a row ended dead",
    )


#: Unix milliseconds below this (March 1973) are taken for Unix seconds given by mistake:
#: read as ms they name a time in January 1970 (a one-shot due at once, a backfill of 1970).
#: A time that early is given as ISO 8601.
SECONDS_LOOK = 10**11


def parse_time(text: str, flag: str) -> int:
    if text.isascii() and text.isdecimal():
        if len(text) > len(str(MAX_MS)):  # nor would int() read 4,300 digits and more
            raise UsageError(f"{flag}: {text[:20]}... is past year 9999 in Unix milliseconds")
        if int(text) > MAX_MS:
            raise UsageError(f"{flag}: {text} is past year 9999 in Unix milliseconds")
        if int(text) < SECONDS_LOOK:
            raise UsageError(
                f"{flag}: {text} looks like Unix seconds; give Unix milliseconds "
                f"({text}000) or ISO 8601 (2026-01-01T09:00:00+00:00)"
            )
        return int(text)
    try:
        parsed = dt.datetime.fromisoformat(text)
    except ValueError:
        raise UsageError(f"{flag}: {text!r} is neither ISO 8601 nor Unix milliseconds") from None
    if parsed.tzinfo is None:
        raise UsageError(f"{flag}: {text!r} needs a time zone offset, e.g. +00:00 or Z")
    ms = int(parsed.timestamp() * 1000)
    if not 0 <= ms <= MAX_MS:
        raise UsageError(f"{flag}: {text!r} is outside 1970-01-01..9999-12-31 UTC")
    return ms


_MODIFIERS = (
    "tz", "jitter", "start", "end", "max_runs", "misfire", "overlap", "catchup_window",
    "spread", "pause_after_failures",
)  # fmt: skip
#: Flags copied into the schedule as they are: flag -> schedule field.
_PLAIN = {
    "tz": "tz", "jitter": "jitter_s", "max_runs": "max_runs", "misfire": "misfire",
    "overlap": "overlap", "catchup_window": "catchup_window_s", "spread": "spread_s",
    "pause_after_failures": "pause_after_failures",
}  # fmt: skip


def _kinds(args: argparse.Namespace) -> list[str]:
    return [k for k in ("every", "cron", "at") if getattr(args, k) is not None]


def schedule_flags_given(args: argparse.Namespace) -> list[str]:
    """The schedule flags given (``--every``, ``--jitter``, ...), as written."""
    return [
        "--" + f.replace("_", "-")
        for f in ("every", "cron", "at", *_MODIFIERS)
        if getattr(args, f) is not None
    ]


def modifiers_only(args: argparse.Namespace) -> bool:
    """Whether the flags change a schedule (--jitter, --end, ...) without giving one."""
    return not _kinds(args) and any(getattr(args, f) is not None for f in _MODIFIERS)


def schedule_from(
    args: argparse.Namespace, required: bool, *, base: dict[str, Any] | None = None
) -> dict[str, Any] | None:
    """The schedule the flags give. Without --every/--cron/--at, modifiers (--jitter,
    --end, ...) apply to ``base`` (the task's current schedule, for ``tasks update``)."""
    kinds = _kinds(args)
    if len(kinds) > 1:
        raise UsageError(f"give one of --every, --cron, --at (got {', '.join(kinds)})")
    extras = [f for f in _MODIFIERS if getattr(args, f) is not None]
    schedule: dict[str, Any]
    if not kinds:
        if base is not None and extras:
            schedule = dict(base)
        elif required or extras:
            raise UsageError("give a schedule: --every SECONDS, --cron EXPR or --at TIME")
        else:
            return None
    elif args.every is not None:
        schedule = {"kind": "interval", "every_s": args.every}
    elif args.cron is not None:
        schedule = {"kind": "cron", "cron": args.cron}
    else:
        schedule = {"kind": "once", "at_ms": parse_time(args.at, "--at")}
    for flag, field in _PLAIN.items():
        if getattr(args, flag) is not None:
            schedule[field] = getattr(args, flag)
    if args.start is not None:
        schedule["start_ms"] = parse_time(args.start, "--start")
    if args.end is not None:
        schedule["end_ms"] = parse_time(args.end, "--end")
    return schedule


def payload_from(text: str | None) -> Any:
    if text is None:
        return None
    if text.startswith("@"):
        text = read_text(text[1:], "--payload")
    try:
        return decode_json(text)
    except ValueError as exc:
        raise UsageError(f"--payload: not JSON: {exc}") from None
