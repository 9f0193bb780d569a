"""Scheduling-core figures: bulk create rate, Redis bytes per task, one poller's enqueue
rate with a backlog of due tasks, and enqueue lag at a sustained fire rate.

The poller runs in this process (one actor, all partitions), logging its lifecycle lines as
JSON to /dev/null so their cost is counted, under a node's garbage-collector policy
(``runtime.gc_policy``). Enqueue lag is measured from the stream entry's
own id (the time Redis appended it) minus the fire's due time.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import trio

from actors.domain.model import TaskSpec
from actors.domain.schedules import Schedule
from actors.scheduling.poller import Poller, PollerSettings
from actors.store.tasks import TaskStore
from bench.common import percentile, used_memory
from runtime import gc_policy
from runtime import logging as node_logging
from runtime.actor import ActorContext
from runtime.config import RedisSection
from runtime.redis_io import RedisClient

CHUNK = 5000


async def register(store: TaskStore, specs: list[TaskSpec]) -> float:
    """Bulk-create ``specs`` CHUNK at a time; return the seconds it took."""
    started = time.perf_counter()
    for i in range(0, len(specs), CHUNK):
        await store.create_many(specs[i : i + CHUNK])
    return time.perf_counter() - started


def run(url: str, backlog: int, rate: int, seconds: float) -> dict[str, Any]:
    with open(os.devnull, "w") as devnull:
        # The poller runs in this process: its lifecycle lines are written (their cost is
        # part of the figures) to /dev/null.
        node_logging.configure(node="bench", stream=devnull)
        try:
            return trio.run(_run, url, backlog, rate, seconds)
        finally:
            node_logging.configure(node="bench", level="warning", stream=sys.stderr)


async def _run(url: str, backlog: int, rate: int, seconds: float) -> dict[str, Any]:
    client = RedisClient.from_settings(url, RedisSection(url=url))
    result: dict[str, Any] = {"backlog": backlog, "rate": rate, "seconds": seconds}
    result |= await _create_and_memory(client, url, backlog)
    result |= await _enqueue_backlog(client, backlog)
    result |= await _sustained_lag(client, rate, seconds)
    await client.aclose()
    return result


async def _create_and_memory(client: RedisClient, url: str, n: int) -> dict[str, Any]:
    store = TaskStore(client, "bench-mem")
    await store.keys()
    far = await store.now_ms() + 86_400_000
    before = used_memory(url)
    specs = [TaskSpec("t", Schedule("interval", every_s=60, start_ms=far)) for _ in range(n)]
    took = await register(store, specs)
    after = used_memory(url)
    await client.execute("FLUSHDB")
    return {
        "bulk_create_per_s": round(n / took),
        "redis_bytes_per_task": round((after - before) / n),
    }


async def _enqueue_backlog(client: RedisClient, n: int) -> dict[str, Any]:
    store = TaskStore(client, "bench-backlog")
    now = await store.now_ms()
    schedule = Schedule("interval", every_s=3600, start_ms=now - 1000)
    await register(store, [TaskSpec("t", schedule) for _ in range(n)])
    keys = await store.keys()
    poller = Poller(store, PollerSettings())
    gc_policy.tune()  # as a node does once built
    log = node_logging.get_logger(actor="bench/poller")
    started = time.perf_counter()
    done = 0
    while done < n:
        done += (await poller.tick(await store.scripts(), poller.partitions(keys), log)).enqueued
    took = time.perf_counter() - started
    await client.execute("FLUSHDB")
    return {"backlog_enqueue_per_s": round(n / took)}


async def _sustained_lag(client: RedisClient, rate: int, seconds: float) -> dict[str, Any]:
    interval_s = 10
    n = rate * interval_s
    store = TaskStore(client, "bench-lag")
    now = await store.now_ms()
    t0 = now + 5000 + n // 20  # registration takes a while; the first fires come after it
    specs = [
        TaskSpec(
            "t", Schedule("interval", every_s=interval_s, start_ms=t0 + i * 1000 * interval_s // n)
        )
        for i in range(n)
    ]
    await register(store, specs)
    keys = await store.keys()
    poller = Poller(store, PollerSettings())
    gc_policy.tune()  # as a node does once built
    ctx = ActorContext("bench/poller", 1.0, node_logging.get_logger(actor="bench/poller"))
    async with trio.open_nursery() as nursery:
        await nursery.start(poller.run, ctx)
        await trio.sleep(max(0.0, (t0 - await store.now_ms()) / 1000) + seconds)
        nursery.cancel_scope.cancel()
    lags = await _stream_lags(client, keys.queue("t"))
    await client.execute("FLUSHDB")
    return {
        "sustained_fires": len(lags),
        "sustained_fires_per_s": round(len(lags) / seconds),
        "enqueue_lag_p50_ms": percentile(lags, 50),
        "enqueue_lag_p99_ms": percentile(lags, 99),
        "enqueue_lag_max_ms": max(lags) if lags else None,
    }


async def _stream_lags(client: RedisClient, stream: str) -> list[float]:
    lags: list[float] = []
    start = "-"
    while True:
        entries = await client.execute("XRANGE", stream, start, "+", "COUNT", 10_000)
        if not entries:
            return lags
        for entry_id, fields in entries:
            lags.append(int(entry_id.split(b"-")[0]) - int(fields[b"due_ms"]))
        start = "(" + entries[-1][0].decode()
