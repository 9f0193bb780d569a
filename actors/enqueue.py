"""Appending fires to their type's stream: shared by the poller and the retry dispatcher."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import attrs

from actors import scripts
from actors.keys import Keys, schedule_id
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
    client: RedisClient, keys: Keys, fires: list[Fire], now_ms: int, actor: str
) -> None:
    """XADD every fire (``enqueue.lua``: one call per type per ENQUEUE_CHUNK fires), then
    log ``queued`` for each. Raises if any call failed: the caller must not commit."""
    by_type: dict[str, list[Any]] = defaultdict(list)
    for fire in fires:
        by_type[fire.type] += [fire.task_id, fire.due_ms, fire.payload, fire.attempt]
    calls = [
        ([keys.queue(task_type)], [now_ms, task_type, *args[i : i + ENQUEUE_CHUNK * 4]])
        for task_type, args in by_type.items()
        for i in range(0, len(args), ENQUEUE_CHUNK * 4)
    ]
    replies = await client.scripts(scripts.ENQUEUE, calls)
    failed = [r for r in replies if isinstance(r, Exception)]
    if failed:
        raise failed[0]
    emit_events(
        actor,
        [
            (
                "queued",
                {
                    "task_id": fire.task_id,
                    "schedule_id": schedule_id(fire.task_id, fire.due_ms),
                    "type": fire.type,
                    "attempt": fire.attempt,
                    "due_ms": fire.due_ms,
                    "enqueue_lag_ms": now_ms - fire.due_ms,
                },
            )
            for fire in fires
        ],
    )
