"""``metronome queues``, ``metronome partitions`` and ``metronome dlq ...``: the operator
views of streams, partitions and dead letters, through the signing client."""

from __future__ import annotations

import argparse
from typing import Any

from actors.admin.client import Client
from actors.admin.exits import EXIT_NOT_FOUND, EXIT_OTHER, Result
from actors.admin.inputs import UsageError, checked_name
from actors.admin.tables import partition_rows, queue_rows, table, when


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


def add_queue_commands(commands: Any) -> None:
    """``metronome queues`` and ``metronome partitions``: what waits, and who serves it."""
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


def add_dlq_commands(commands: Any) -> None:
    """``metronome dlq ...``: list, show, replay and purge dead letters."""
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
