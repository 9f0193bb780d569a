"""The cost of one Redis round trip through ``runtime.redis_io`` vs redis-py called directly.

Direct: a plain loop of redis-py calls on one thread. Through the layer: the same calls from
trio, each hopping to a worker thread and back; sequentially (latency) and from 16 trio
tasks at once (throughput). Also a 100-command pipeline, to show what batching buys.
"""

from __future__ import annotations

import time

import redis
import trio

from runtime.config import RedisSection
from runtime.redis_io import RedisClient


def run(url: str, calls: int) -> dict[str, float]:
    direct = redis.Redis.from_url(url)
    direct.ping()
    started = time.perf_counter()
    for _ in range(calls):
        direct.ping()
    direct_us = (time.perf_counter() - started) / calls * 1e6
    direct.close()
    return {"direct_us_per_call": round(direct_us, 1), **trio.run(_through_layer, url, calls)}


async def _through_layer(url: str, calls: int) -> dict[str, float]:
    client = RedisClient.from_settings(url, RedisSection(url=url))
    await client.ping()
    started = time.perf_counter()
    for _ in range(calls):
        await client.ping()
    sequential_us = (time.perf_counter() - started) / calls * 1e6

    per_task = calls // 16

    async def worker() -> None:
        for _ in range(per_task):
            await client.ping()

    started = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(16):
            nursery.start_soon(worker)
    concurrent_per_s = per_task * 16 / (time.perf_counter() - started)

    batch = [("PING",)] * 100
    started = time.perf_counter()
    rounds = max(1, calls // 100)
    for _ in range(rounds):
        await client.pipeline(batch)
    pipelined_us = (time.perf_counter() - started) / (rounds * 100) * 1e6
    await client.aclose()
    return {
        "layer_us_per_call": round(sequential_us, 1),
        "layer_concurrent_calls_per_s": round(concurrent_per_s),
        "layer_pipelined_us_per_command": round(pipelined_us, 2),
    }
