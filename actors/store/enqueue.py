"""Appending fires to their type's stream: shared by the poller and the retry dispatcher.

Duplicates are stopped here, at the source: ``enqueue.lua`` remembers each fire (schedule_id
and attempt) for ``dedupe_window_ms`` in a key of the stream's own slot, so appending and
remembering are one atomic step. A poller that died after appending and before committing
leaves its fires to be claimed again; when they are, they are dropped here
(``duplicate_dropped``) instead of running twice. The window must outlast the claim lease.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import attrs

from actors.store import scripts
from actors.store.keys import Keys, schedule_id
from runtime.logging import emit_events
from runtime.redis_io import RedisClient

#: Most fires per enqueue script call: bounds how long one call holds Redis (~1-2 ms).
ENQUEUE_CHUNK = 500


@attrs.frozen
class Fire:
    task_id: str
    type: str
    payload: bytes | str
    due_ms: int
    attempt: int = 0


async def enqueue_fires(
    client: RedisClient,
    keys: Keys,
    fires: list[Fire],
    now_ms: int,
    actor: str,
    dedupe_window_ms: int,
) -> int:
    """XADD every fire not enqueued within the window (``enqueue.lua``: one call per type
    per ENQUEUE_CHUNK fires), log ``queued`` or ``duplicate_dropped`` for each, and return
    how many were appended. Raises if any call failed: the caller must not commit."""
    by_type: dict[str, list[Fire]] = defaultdict(list)
    for fire in fires:
        by_type[fire.type].append(fire)
    calls = []
    ordered: list[Fire] = []
    for task_type, group in by_type.items():
        for i in range(0, len(group), ENQUEUE_CHUNK):
            chunk = group[i : i + ENQUEUE_CHUNK]
            args: list[Any] = [now_ms, task_type, keys.enqueued_prefix(task_type), dedupe_window_ms]
            for fire in chunk:
                args += [fire.task_id, fire.due_ms, fire.payload, fire.attempt]
            calls.append(([keys.queue(task_type)], args))
            ordered += chunk
    replies = await client.scripts(scripts.ENQUEUE, calls)
    failed = [r for r in replies if isinstance(r, Exception)]
    if failed:
        raise failed[0]
    flags = [int(flag) for reply in replies for flag in reply]
    emit_events(
        actor,
        [
            (
                "queued" if flag else "duplicate_dropped",
                {
                    "task_id": fire.task_id,
                    "schedule_id": schedule_id(fire.task_id, fire.due_ms),
                    "type": fire.type,
                    "attempt": fire.attempt,
                    "due_ms": fire.due_ms,
                    "enqueue_lag_ms": now_ms - fire.due_ms,
                },
            )
            for fire, flag in zip(ordered, flags, strict=True)
        ],
    )
    return sum(flags)
