"""How the ``metronome`` CLI reads what a user types: schedule flags, times, payloads."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import typing
from pathlib import Path
from typing import Any

from actors.domain.schedules import Misfire


class UsageError(Exception):
    """A command line that cannot be run as given: one line on stderr, exit 2."""


def add_schedule_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("schedule (one of --every, --cron, --at)")
    group.add_argument("--every", type=float, metavar="SECONDS", help="fire every N seconds")
    group.add_argument("--cron", metavar="EXPR", help="five-field cron expression")
    group.add_argument("--tz", help="time zone of --cron (default UTC)")
    group.add_argument("--at", metavar="TIME", help="once, at an ISO 8601 time or Unix ms")
    group.add_argument("--jitter", type=float, metavar="SECONDS", help="random delay up to N s")
    group.add_argument("--start", metavar="TIME", help="no fires before (ISO 8601 or Unix ms)")
    group.add_argument("--end", metavar="TIME", help="no fires after (ISO 8601 or Unix ms)")
    group.add_argument("--max-runs", type=int, metavar="N", help="finish after N fires")
    group.add_argument("--misfire", choices=typing.get_args(Misfire))


def parse_time(text: str, flag: str) -> int:
    if text.isdigit():
        return int(text)
    try:
        parsed = dt.datetime.fromisoformat(text)
    except ValueError:
        raise UsageError(f"{flag}: {text!r} is neither ISO 8601 nor Unix milliseconds") from None
    if parsed.tzinfo is None:
        raise UsageError(f"{flag}: {text!r} needs a time zone offset, e.g. +00:00 or Z")
    return int(parsed.timestamp() * 1000)


def schedule_from(args: argparse.Namespace, required: bool) -> dict[str, Any] | None:
    kinds = [k for k in ("every", "cron", "at") if getattr(args, k) is not None]
    if len(kinds) > 1:
        raise UsageError(f"give one of --every, --cron, --at (got {', '.join(kinds)})")
    if not kinds:
        extras = [f for f in ("tz", "jitter", "start", "end", "max_runs", "misfire")
                  if getattr(args, f) is not None]  # fmt: skip
        if required or extras:
            raise UsageError("give a schedule: --every SECONDS, --cron EXPR or --at TIME")
        return None
    schedule: dict[str, Any]
    if args.every is not None:
        schedule = {"kind": "interval", "every_s": args.every}
    elif args.cron is not None:
        schedule = {"kind": "cron", "cron": args.cron}
    else:
        schedule = {"kind": "once", "at_ms": parse_time(args.at, "--at")}
    if args.tz is not None:
        schedule["tz"] = args.tz
    if args.jitter is not None:
        schedule["jitter_s"] = args.jitter
    if args.start is not None:
        schedule["start_ms"] = parse_time(args.start, "--start")
    if args.end is not None:
        schedule["end_ms"] = parse_time(args.end, "--end")
    if args.max_runs is not None:
        schedule["max_runs"] = args.max_runs
    if args.misfire is not None:
        schedule["misfire"] = args.misfire
    return schedule


def payload_from(text: str | None) -> Any:
    if text is None:
        return None
    if text.startswith("@"):
        text = Path(text[1:]).read_text(encoding="utf-8")
    try:
        return json.loads(text)
    except ValueError as exc:
        raise UsageError(f"--payload: not JSON: {exc}") from None
