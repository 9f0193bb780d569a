"""Appending fires to their type's stream, with their lifecycle lines: shared by the
poller, the retry dispatcher and a manual trigger.

Duplicates are stopped here, at the source: ``enqueue.lua`` remembers each fire (schedule_id
and attempt) for ``dedupe_window_ms`` in a key of the stream's own slot, so appending and
remembering are one atomic step. A poller that died after appending and before committing
leaves its fires to be claimed again; when they are, they are dropped here
(``duplicate_dropped``) instead of running twice. The window must outlast the claim lease.
"""

from __future__ import annotations

from collections.abc import Sequence

from actors.store.keys import schedule_id
from actors.store.replies import Fire
from actors.store.scripts import Scripts
from runtime.logging import emit_events


async def enqueue_fires(
    scripts: Scripts, fires: Sequence[Fire], now_ms: int, actor: str, dedupe_window_ms: int
) -> int:
    """XADD every fire not enqueued within the window, log ``queued`` or
    ``duplicate_dropped`` for each, and return how many were appended. Raises if any call
    failed: the caller must not commit."""
    flags = await scripts.enqueue(fires, now_ms, dedupe_window_ms)
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
            for fire, flag in zip(fires, flags, strict=True)
        ],
    )
    return sum(flags)
