"""``metronome tasks pause|resume|stop|rm|trigger|backfill --selector ...``: one action
over every task a selector matches (``POST /v1/tasks/actions``; docs/API.md).

    metronome tasks pause --selector 'type=email,tenant=acme' --dry-run
    metronome tasks pause --selector 'type=email,tenant=acme' --note "incident 42" --yes
    metronome tasks trigger --selector 'status=paused,team=ops' --yes

A selector is ``key=value`` pairs separated by commas: ``type``, ``status``,
``next_before`` (Unix ms) and ``last_status`` are the listing's filters, any other key is
a label. Every action first asks for a dry run and shows the count and a sample; it is
applied only with ``--yes`` (without it: the count, and exit status 2, as ``tasks clear``
does without ``--yes``).
"""

from __future__ import annotations

import argparse
import secrets
from typing import Any

from actors.admin.client import ApiError, ApiUnavailable, Client
from actors.admin.exits import EXIT_CONFLICT, Result
from actors.admin.inputs import UsageError

#: Selector keys that are filters; any other key is a label.
FILTERS = ("type", "status", "next_before", "last_status", "last_fate")
#: The CLI's command names and the API's action names.
ACTIONS = {"pause": "pause", "resume": "resume", "stop": "stop", "rm": "delete",
           "trigger": "trigger", "backfill": "backfill"}  # fmt: skip


def parse_selector(text: str) -> dict[str, Any]:
    """``type=email,tenant=acme`` -> ``{"type": "email", "labels": {"tenant": "acme"}}``."""
    selector: dict[str, Any] = {}
    labels: dict[str, str] = {}
    given: dict[str, str] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        key, sep, value = part.partition("=")
        if not sep or not key:
            raise UsageError(f"--selector: {part!r} must be key=value")
        # Every pair must match: a key given twice with two values would keep the last
        # alone, and act on tasks the first excluded.
        if given.setdefault(key, value) != value:
            raise UsageError(f"--selector: {key!r} is given twice with different values")
        if key == "next_before":
            if not (value.isascii() and value.isdecimal()):
                raise UsageError(f"--selector: next_before must be Unix ms, got {value!r}")
            selector[key] = int(value)
        elif key in FILTERS:
            selector[key] = value
        else:
            labels[key] = value
    if labels:
        selector["labels"] = labels
    return selector


def add_selector_flags(parser: argparse.ArgumentParser, *, dry_run: bool = True) -> None:
    """The flags of an action over selected tasks (instead of one task id); ``dry_run``:
    add ``--dry-run`` (a command that has its own leaves it out)."""
    flag = parser.add_argument
    flag("--selector", metavar="K=V,...",
         help="act on every task matching: type=, status=, next_before=, last_status=, "
         "last_fate=, other keys are labels")  # fmt: skip
    flag("--all", action="store_true", dest="all_tasks",
         help="with an empty --selector '': every task of the namespace")  # fmt: skip
    if dry_run:
        flag("--dry-run", action="store_true", dest="dry_run",
             help="with --selector: count the matching tasks, change nothing")  # fmt: skip
        parser.set_defaults(dry_run_is_a_selector_flag=True)
    flag("--yes", action="store_true", help="with --selector: apply it")
    flag("--action-id", dest="action_id",
         help="with --selector: your id for the action (a repeat continues it; without "
              "it the CLI names one, and says it if the apply is cut off)")  # fmt: skip


def selected(args: argparse.Namespace) -> bool:
    """Whether the command acts on a selector (else on one task id, which it needs)."""
    if args.selector is None:
        if args.task_id is None:
            raise UsageError(f"tasks {args.action}: give a task id or --selector")
        # Ignored, a --dry-run would let the change through: refused, so nothing is done
        # (--yes only confirms what a task id does anyway).
        given = [name for name, on in (
            ("--dry-run", args.dry_run and getattr(args, "dry_run_is_a_selector_flag", False)),
            ("--all", args.all_tasks), ("--action-id", args.action_id),
        ) if on]  # fmt: skip
        if given:
            raise UsageError(
                f"tasks {args.action}: {', '.join(given)}: only with --selector, not with a "
                "task id (nothing was changed)"
            )
        return False
    if args.task_id is not None:
        raise UsageError(f"tasks {args.action}: give a task id or --selector, not both")
    return True


def run_action(api: Client, args: argparse.Namespace, **extra: Any) -> Result:
    """The dry run, then (with ``--yes``) the action; ``extra``: note, overlap, window."""
    action = ACTIONS[args.action]
    selector = parse_selector(args.selector)
    every = bool(args.all_tasks)
    options = {k: v for k, v in extra.items() if v is not None}
    dry = api.tasks_action(action, selector, dry_run=True, every=every, **options)
    sample = ", ".join(dry["sample"]) + (" ..." if dry["count"] > len(dry["sample"]) else "")
    shown = f"{dry['count']} tasks match" + (f": {sample}" if sample else "")
    if args.dry_run:
        return dry, f"{shown} (dry run: nothing changed)"
    if not args.yes:
        raise UsageError(
            f"tasks {args.action} --selector would {action} {shown}; add --yes to apply it "
            "(--dry-run only counts)"
        )
    # An id of the CLI's own when none is given: an action outlasting --timeout, or cut off
    # by a failover, goes on in the node, and is seen through (never applied twice) by the
    # same command with this id; a rerun without it would be another action (a trigger:
    # every task fired again).
    action_id = args.action_id or f"cli-{secrets.token_hex(8)}"
    try:
        done = api.tasks_action(action, selector, every=every, action_id=action_id, **options)
    except ApiUnavailable as exc:
        raise ApiUnavailable(f"{exc}; {_see_through(action_id)}") from None
    except ApiError as exc:
        if exc.status < 500:
            raise
        detail = f"{exc.detail}; {_see_through(action_id)}"
        raise ApiError(exc.status, exc.code, detail, exc.errors) from None
    human = (
        f"{action} {done['action_id']}: {done['count']} tasks, {done['changed']} changed, "
        f"{done['unchanged']} unchanged, {done['failed_count']} failed"
    )
    human += "".join(f"\n  {f['task_id']}: {f['reason']}" for f in done["failed"])
    if done["failed_count"]:  # done in part, as a task id's refused change: a conflict
        return done, human, EXIT_CONFLICT
    return done, human


def _see_through(action_id: str) -> str:
    return (
        f"action {action_id} may have been applied in part and go on: run the same command "
        f"with --action-id {action_id} to see it through (an action id is applied once)"
    )
