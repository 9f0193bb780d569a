"""What an operator's reads cost at the size ``bench idle`` registered: the store calls
behind ``metronome tasks ls`` (a first page, a page of one type, a page of a status no task
has, which reads the most index pages one call may), ``tasks get`` and ``tasks explain``,
and the count by status that ``/metrics`` refreshes in the background. Each is timed
``CALLS`` times from this process (wall time of the store call; the API adds its HTTP
round trip, ``bench api``'s ``healthz`` floor)."""

from __future__ import annotations

import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

from actors.api.explain import explain
from actors.store.tasks import TaskStore
from bench.common import percentile

CALLS = 20


async def run(store: TaskStore) -> dict[str, Any]:
    first, _ = await store.list_tasks(limit=100)
    ids = [task.task_id for task in first]
    rng = random.Random(1)
    figures: dict[str, Any] = {
        "ls_first_page_ms": await _timed(lambda: store.list_tasks(limit=100)),
        "ls_type_page_ms": await _timed(lambda: store.list_tasks("bench", limit=100)),
        "ls_no_match_call_ms": await _timed(lambda: store.list_tasks(status="paused", limit=100)),
        "get_ms": await _timed(lambda: store.get(rng.choice(ids))),
        "explain_ms": await _timed(lambda: explain(store, rng.choice(ids))),
    }
    started = time.perf_counter()
    await store.count_by_status()
    figures["count_by_status_s"] = round(time.perf_counter() - started, 2)
    return figures


async def _timed(call: Callable[[], Awaitable[Any]]) -> dict[str, float]:
    took = []
    for _ in range(CALLS):
        started = time.perf_counter()
        await call()
        took.append((time.perf_counter() - started) * 1000)
    return {"p50": round(percentile(took, 50), 2), "max": round(max(took), 2)}
