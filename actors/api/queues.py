"""Queues and dead letters as operators see them: backlog per type, and DLQ list/replay/purge.

The seed had no backlog view; this is it. Everything here reads or moves stream entries of
one type (``{ns:q:<type>}``), so each operation is one slot. Reads are bounded: a page of
dead letters, a capped count of retries. Replaying is ``replay_dead.lua`` (atomic per entry).
"""

from __future__ import annotations

from typing import Any

import attrs

from actors.store.codes import REPLAY_MALFORMED, REPLAY_MISSING
from actors.store.keys import Keys
from actors.store.messages import MalformedMessage, Message, flat_fields
from actors.store.queue_rows import as_text, error_line, queue_row, stored_number, stream_id_ms
from actors.store.tasks import TaskStore
from runtime.logging import emit_events

#: Retry contexts read to count retries per type; beyond this the count is left out.
RETRY_COUNT_CAP = 10_000
#: Dead letters moved per replay script call.
REPLAY_BATCH = 200
#: Undelivered messages deleted per purge script call.
PURGE_BATCH = 1000
#: The ``actor`` field of log lines written from API or CLI calls.
ADMIN_ACTOR = "admin"


@attrs.frozen
class DeadLetter:
    entry_id: str
    dead_ms: int
    fields: dict[str, str]

    def to_dict(self) -> dict[str, Any]:
        """The entry's fields, plus ``error_line`` (the exception's line) for lists."""
        # its own id wins over a field of that name (another producer's)
        fields = {k: v for k, v in self.fields.items() if k != "entry_id"}
        out = {"entry_id": self.entry_id, "dead_ms": self.dead_ms, **fields}
        if "error" in self.fields:
            out["error_line"] = error_line(self.fields["error"])
        return out


def _dead_letter(entry_id: bytes, raw: Any) -> DeadLetter:
    fields = {as_text(k): as_text(v) for k, v in flat_fields(raw).items()}
    dead_ms = fields.pop("dead_ms", None)
    when = stored_number(dead_ms)
    if when is None:  # not one Metronome wrote: the entry's own time
        when = stream_id_ms(entry_id)
    return DeadLetter(as_text(entry_id), when, fields)


def tally(results: dict[str, str]) -> dict[str, int]:
    """Counts of ``replay`` outcomes: 'missing', 'malformed', or a new stream id (replayed)."""
    counts = {"replayed": 0, REPLAY_MALFORMED: 0, REPLAY_MISSING: 0}
    for outcome in results.values():
        counts[outcome if outcome in counts else "replayed"] += 1
    return counts


class Queues:
    """Backlog and dead letters of a namespace's types."""

    def __init__(self, store: TaskStore) -> None:
        self.store = store
        self.client = store.client

    async def stats(self, task_types: list[str] | None = None) -> dict[str, Any]:
        """Per type: stream length, undelivered, pending, oldest pending age, consumers
        (pending, idle), DLQ length, retries waiting. Types default to every known type."""
        keys = await self.store.keys()
        types = task_types if task_types is not None else await self.store.types()
        now = await self.store.now_ms()
        retrying, retry_total = await self._retries_by_type(keys)

        rows = await (await self.store.streams()).queue_infos(types)
        out = [
            queue_row(task_type, row, now, retrying)
            for task_type, row in zip(types, rows, strict=True)
        ]
        return {"now_ms": now, "retrying_total": retry_total, "queues": out}

    async def _retries_by_type(self, keys: Keys) -> tuple[dict[str, int] | None, int]:
        """(retries per type or None when more than RETRY_COUNT_CAP wait, total waiting)."""
        cards = await self.client.pipeline(
            [("ZCARD", keys.retry(p)) for p in range(keys.partitions)]
        )
        total = sum(int(c) for c in cards if isinstance(c, int))
        if total > RETRY_COUNT_CAP:
            return None, total
        # a retry key of another kind (its ZCARD an error in place) counts none
        busy = [p for p in range(keys.partitions) if isinstance(cards[p], int) and cards[p]]
        members = await self.client.pipeline([("ZRANGE", keys.retry(p), 0, -1) for p in busy])
        kinds = await self.client.pipeline(
            [
                ("HGET", keys.retry_context_prefix(p) + as_text(sid), "type")
                for p, sids in zip(busy, members, strict=True)
                for sid in sids
            ]
        )
        by_type: dict[str, int] = {}
        for kind in kinds:
            if isinstance(kind, bytes):
                name = as_text(kind)
                by_type[name] = by_type.get(name, 0) + 1
        return by_type, total

    # -- dead letters ---------------------------------------------------------------------

    async def dead_letters(
        self, task_type: str, before: str | None = None, limit: int = 50
    ) -> tuple[list[DeadLetter], str | None]:
        """Newest first; pass the returned cursor as ``before`` for the next page."""
        keys = await self.store.keys()
        if before == "0-0":  # nothing is older than the first possible id
            return [], None
        top = f"({before}" if before else "+"
        streams = await self.store.streams()
        entries = await streams.read_range(
            keys.dlq(task_type), top, "-", limit + 1, newest_first=True
        )
        page = [_dead_letter(i, f) for i, f in entries[:limit]]
        return page, (page[-1].entry_id if len(entries) > limit else None)

    async def dead_letter(self, task_type: str, entry_id: str) -> DeadLetter | None:
        keys = await self.store.keys()
        streams = await self.store.streams()
        entries = await streams.read_range(keys.dlq(task_type), entry_id, entry_id, 1)
        return _dead_letter(*entries[0]) if entries else None

    async def replay(self, task_type: str, entry_ids: list[str]) -> dict[str, str]:
        """Move dead letters back to the stream; entry id -> new stream id, 'missing' or
        'malformed' (kept: an entry a consumer would not read as a message, its payload
        not JSON or its due time not a whole number in range, say; moved, it would only
        come back as a new dead letter)."""
        scripts = await self.store.scripts()
        results: dict[str, str] = {}
        for i in range(0, len(entry_ids), REPLAY_BATCH):
            chunk = entry_ids[i : i + REPLAY_BATCH]
            results |= dict.fromkeys(chunk, REPLAY_MALFORMED)  # but those sent, below
            batch = await self._not_malformed(task_type, chunk)
            replies = await scripts.replay_dead(task_type, batch) if batch else []
            events = []
            for entry, (outcome, task_id) in zip(batch, replies, strict=True):
                results[entry] = outcome
                if outcome not in (REPLAY_MISSING, REPLAY_MALFORMED):
                    fields = {"task_id": task_id, "type": task_type, "entry_id": entry}
                    events.append(("replayed", {**fields, "msg_id": outcome}))
            # Each batch's lines once it is moved: a later batch failing must not leave
            # these moved unsaid (a retry of the call finds them missing).
            emit_events(ADMIN_ACTOR, events)
        return results

    async def _not_malformed(self, task_type: str, entry_ids: list[str]) -> list[str]:
        """The ids of ``entry_ids`` that are gone (the script says so) or that a consumer
        reads as a message once replayed (attempt 0, queued now)."""
        keys = await self.store.keys()
        dlq = keys.dlq(task_type)
        found = await self.store.client.pipeline([("XRANGE", dlq, e, e) for e in entry_ids])
        kept = []
        for entry, reply in zip(entry_ids, found, strict=True):
            if isinstance(reply, list) and reply:
                fields = {**flat_fields(reply[0][1]), b"attempt": b"0"}
                fields.pop(b"enq_ms", None)
                try:
                    Message.decode(entry, fields, task_type)
                except MalformedMessage:
                    continue
            kept.append(entry)
        return kept

    async def replay_all(self, task_type: str) -> dict[str, int]:
        """Replay every dead letter of a type present when the call starts (not ones that
        arrive meanwhile: a handler failing again must not make this loop forever)."""
        keys = await self.store.keys()
        streams = await self.store.streams()
        newest = await streams.read_range(keys.dlq(task_type), "+", "-", 1, newest_first=True)
        counts = tally({})
        if not newest:
            return counts
        last, start = as_text(newest[0][0]), "-"
        while True:
            entries = await streams.read_range(keys.dlq(task_type), start, last, REPLAY_BATCH)
            if not entries:
                return counts
            results = await self.replay(task_type, [as_text(i) for i, _ in entries])
            for outcome, n in tally(results).items():
                counts[outcome] += n
            start = f"({as_text(entries[-1][0])}"

    async def purge_queue(self, task_type: str) -> int:
        """Delete the type's undelivered messages present when the call starts (their fires
        do not run; messages being run are untouched); how many."""
        keys = await self.store.keys()
        streams = await self.store.streams()
        newest = await streams.read_range(keys.queue(task_type), "+", "-", 1, newest_first=True)
        if not newest:
            return 0
        scripts = await self.store.scripts()
        last, purged = as_text(newest[0][0]), 0
        while True:
            # Looked at first: the flights the batch's fires hold (tasks with an overlap
            # policy) end before the fires go, so a call cut off or refused in between
            # leaves no task's mark naming a fire that is gone (purge_queue.lua).
            found, ended, upto = await scripts.purge_queue(task_type, last, PURGE_BATCH, look=True)
            if not found:
                break
            if ended:
                await scripts.end_flights(ended)
            deleted, _, _ = await scripts.purge_queue(task_type, upto, found)
            purged += deleted
            if found < PURGE_BATCH:
                break
        emit_events(ADMIN_ACTOR, [("queue_purged", {"type": task_type, "count": purged})])
        return purged

    async def purge(self, task_type: str, entry_ids: list[str] | None = None) -> int:
        """Delete the given dead letters, or (None) the whole DLQ of the type."""
        count = await (await self.store.streams()).purge_dead(task_type, entry_ids)
        emit_events(ADMIN_ACTOR, [("purged", {"type": task_type, "count": count})] if count else [])
        return count
