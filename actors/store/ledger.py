"""Reading the occurrence ledger: a task's history and the attention list.

The scripts that decide a fire's fate write both (``lua/history.lua``); this module reads
them for the API, the CLI, explain and the metrics, and takes a task off the attention
list when an operator acknowledges it (``acknowledge.lua``).

**The attention list** is an index kept as fates are written, never found by a scan of
the tasks: ``Keys.attention`` (task id -> ``reason since_ms due_ms type``) in each
partition, and ``Keys.attention_counts`` (``type reason`` -> count) beside it, so the
gauge reads a few small hashes whatever the number of tasks. A task is on it while its
latest occurrence is ``dead``, ``expired``, skipped (overlap or misfire) or started later
than its type's ``late_after_s``; an ``ok`` on time, or an operator's acknowledgement,
takes it off.
"""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

import attrs

from actors.domain.errors import InvalidTask, TaskNotFound
from actors.store import lua
from actors.store.codes import Code
from actors.store.history import Occurrence, decode_ring
from actors.store.queue_rows import short_error_line, stored_number
from actors.store.tasks import TaskStore

#: Attention reasons, as the list and the gauge name them.
REASONS = ("dead", "expired", "skipped", "late")
#: The most entries one page of the attention list returns.
MAX_PAGE = 500
#: Entries one HSCAN step asks a partition for.
_SCAN_COUNT = 500


@attrs.frozen
class AttentionEntry:
    task_id: str
    type: str
    reason: str
    since_ms: int
    due_ms: int
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)


def parse_entry(task_id: str, raw: bytes) -> AttentionEntry | None:
    """A stored attention entry, or None when it does not read (written by hand)."""
    parts = raw.decode(errors="replace").split(" ", 3)
    if len(parts) != 4:
        return None
    since, due = stored_number(parts[1]), stored_number(parts[2].removeprefix("-"))
    if since is None or due is None:
        return None
    return AttentionEntry(task_id, parts[3], parts[0], since, -due if parts[2][:1] == "-" else due)


async def task_history(
    store: TaskStore, task_id: str, limit: int | None = None
) -> list[Occurrence]:
    """The task's occurrences, newest first (at most ``limit``); TaskNotFound when no such
    task exists. Node numbers are named from the namespace's node-number hash."""
    keys = await store.keys()
    p = keys.partition_of(task_id)
    state, ring, errors = await store.client.reads(
        [
            ("HGET", keys.states(p, keys.bucket_of(task_id)), task_id),
            ("HGET", keys.history(p), task_id),
            ("HGET", keys.history_errors(p), task_id),
        ]
    )
    if state is None:
        raise TaskNotFound(task_id)
    occurrences = decode_ring(ring or b"", errors=errors)[:limit]
    numbers = sorted({o.node for o in occurrences if o.node is not None})
    if not numbers:
        return occurrences
    names = await store.client.execute(
        "HMGET", keys.node_numbers, *[f"number:{n[1:]}" for n in numbers]
    )
    named = {n: v.decode(errors="replace") for n, v in zip(numbers, names, strict=True) if v}
    return [
        attrs.evolve(o, node=named.get(o.node, o.node)) if o.node is not None else o
        for o in occurrences
    ]


async def attention_page(
    store: TaskStore,
    *,
    task_type: str | None = None,
    reason: str | None = None,
    limit: int = 100,
    cursor: str | None = None,
) -> tuple[list[AttentionEntry], str | None]:
    """One page of the attention list (partition by partition, ``HSCAN``), filtered by
    type and reason, and the cursor of the next page (None: the end). A cursor is
    ``partition:scan cursor``; a page may hold a few more than ``limit`` (a scan step's)."""
    keys = await store.keys()
    partition, scan = _parse_cursor(cursor, keys.partitions)
    found: list[AttentionEntry] = []
    while partition < keys.partitions and len(found) < limit:
        scan, flat = await store.client.execute(
            "HSCAN", keys.attention(partition), scan, "COUNT", _SCAN_COUNT
        )
        scan = int(scan)
        pairs = flat.items() if isinstance(flat, dict) else zip(flat[::2], flat[1::2], strict=True)
        for field, raw in pairs:
            entry = parse_entry(field.decode(errors="replace"), raw)
            if entry is None or (task_type and entry.type != task_type):
                continue
            if reason and entry.reason != reason:
                continue
            found.append(entry)
        if scan == 0:
            partition += 1
    nxt = None if partition >= keys.partitions else f"{partition}:{scan}"
    return await _with_errors(store, found), nxt


def _parse_cursor(cursor: str | None, partitions: int) -> tuple[int, int]:
    if not cursor:
        return 0, 0
    head, _, scan = cursor.partition(":")
    if not (
        head.isascii()
        and scan.isascii()
        and head.isdecimal()
        and scan.isdecimal()
        and len(head) <= 6
        and len(scan) <= 20
        and int(head) < partitions
        and int(scan) < 2**64
    ):  # a SCAN cursor: Redis refuses a larger one
        raise InvalidTask(f"cursor: not one this list gave ({cursor!r})")
    return int(head), int(scan)


async def _with_errors(store: TaskStore, entries: list[AttentionEntry]) -> list[AttentionEntry]:
    """Dead tasks' entries with their last error's line (``error_line``)."""
    dead = [e for e in entries if e.reason == "dead"]
    if not dead:
        return entries
    keys = await store.keys()
    raws = await store.client.pipeline(
        [("HGET", keys.errors(keys.partition_of(e.task_id)), e.task_id) for e in dead]
    )
    lines = {e.task_id: _error_line(r) for e, r in zip(dead, raws, strict=True)}
    return [
        attrs.evolve(e, error=lines.get(e.task_id)) if e.reason == "dead" else e for e in entries
    ]


def _error_line(raw: Any) -> str | None:
    """The line of a dead fire's stored error that says what happened (``error_line``)."""
    if not isinstance(raw, bytes):
        return None
    return short_error_line(raw.decode(errors="replace")) or None


async def attention_counts(store: TaskStore) -> dict[tuple[str, str], int]:
    """How many tasks are on the attention list, by (type, reason)."""
    keys = await store.keys()
    replies = await store.client.pipeline(
        [("HGETALL", keys.attention_counts(p)) for p in range(keys.partitions)]
    )
    out: dict[tuple[str, str], int] = defaultdict(int)
    for reply in replies:
        if not isinstance(reply, dict):
            continue
        for field, count in reply.items():
            task_type, _, reason = field.decode(errors="replace").partition(" ")
            text = count.decode(errors="replace")
            digits = text[1:] if text.startswith("-") else text
            # a count that is no whole number (another program's) is left out
            if reason in REASONS and digits.isascii() and digits.isdigit() and len(text) < 17:
                out[(task_type, reason)] += int(text)
    return dict(out)


async def acknowledge(
    store: TaskStore, task_id: str, note: str | None, by: str | None, at_ms: int
) -> AttentionEntry | None:
    """Take the task off the attention list with the operator's note (kept in
    ``Keys.acks``): the entry it had, or None when it was not on the list. TaskNotFound
    when no such task exists."""
    keys = await store.keys()
    p = keys.partition_of(task_id)
    ack: dict[str, Any] = {"at_ms": at_ms}
    if note is not None:
        ack["note"] = note
    if by is not None:
        ack["by"] = by
    code, entry = await store.client.script(
        lua.ACKNOWLEDGE,
        [keys.schedule(p)],
        [keys.tag(p), task_id, keys.bucket_of(task_id), json.dumps(ack, separators=(",", ":"))],
    )
    if int(code) == Code.NOT_FOUND:
        raise TaskNotFound(task_id)
    return parse_entry(task_id, entry) if entry else None


async def acknowledgement(store: TaskStore, task_id: str) -> dict[str, Any] | None:
    """The operator's last acknowledgement of the task, if any."""
    keys = await store.keys()
    raw = await store.client.execute("HGET", keys.acks(keys.partition_of(task_id)), task_id)
    if raw is None:
        return None
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):  # RecursionError: nested past the decoder's depth
        return {"unreadable": raw.decode(errors="replace")[:200]}
    return value if isinstance(value, dict) else {"unreadable": str(value)[:200]}
