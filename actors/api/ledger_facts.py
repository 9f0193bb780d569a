"""A task's ledger as explain shows it: its last occurrences, whether it is on the
attention list and why, and the operator's last acknowledgement, as facts and sentences
(``actors.store.ledger`` reads them)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from actors.store.ledger import acknowledgement, parse_entry, task_history
from actors.store.tasks import TaskStore


def _iso(ms: int) -> str:
    try:
        return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat(timespec="milliseconds")
    except (ValueError, OverflowError, OSError):  # beyond what a date can say (a due_ms
        return str(ms)  # another producer's message carried, up to 2^53)


async def ledger_facts(store: TaskStore, task_id: str, shown: int) -> dict[str, Any]:
    """``history`` (the last ``shown`` occurrences, newest first), ``attention`` (its
    entry, or None) and ``acknowledged`` (the last acknowledgement, or None)."""
    keys = await store.keys()
    raw = await store.client.execute("HGET", keys.attention(keys.partition_of(task_id)), task_id)
    entry = parse_entry(task_id, raw) if raw is not None else None
    return {
        "history": [o.to_dict() for o in await task_history(store, task_id, shown)],
        "attention": entry.to_dict() if entry is not None else None,
        "acknowledged": await acknowledgement(store, task_id),
    }


def ledger_sentences(facts: dict[str, Any]) -> list[str]:
    """What an operator reads first about the task's recent fires."""
    out = []
    entry = facts.get("attention")
    if entry:
        out.append(
            f"It needs attention: its latest occurrence, due {_iso(entry['due_ms'])}, "
            f"was {entry['reason']} (on the list since {_iso(entry['since_ms'])})."
        )
    history = facts.get("history") or []
    if history:
        fates = ", ".join(o["fate"] + (f" ({o['reason']})" if o["reason"] else "") for o in history)
        out.append(f"Its last {len(history)} occurrences, newest first: {fates}.")
    return out
