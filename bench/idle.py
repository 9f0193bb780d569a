"""``python -m bench idle N``: a node's CPU share and Redis bytes per task with N tasks
registered and none due (all first due in a day), and what an operator's reads cost at that
size (``bench/reads.py``). ``--processes K``: the node runs its scheduler and K consumer
processes as children; the CPU is the whole process tree's."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import trio

from actors.domain.model import TaskSpec
from actors.domain.schedules import Schedule
from actors.store.tasks import TaskStore
from bench import reads
from bench.common import tree_cpu_seconds, used_memory
from bench.fire import NAMESPACE, start_nodes, stop_nodes
from bench.schedule import register
from runtime.config import RedisSection
from runtime.redis_io import RedisClient


def run(url: str, n: int, seconds: float, processes: int = 0) -> dict[str, Any]:
    baseline = used_memory(url)
    register_s = trio.run(_register, url, n)
    bytes_per_task = (used_memory(url) - baseline) / n
    read_costs = trio.run(_reads, url)
    workdir = Path(tempfile.mkdtemp(prefix="metronome-bench-idle-"))
    procs = start_nodes(workdir, url, 1, 10, "info", processes=processes)
    try:
        time.sleep(3.0)  # start-up
        before, t = tree_cpu_seconds(procs[0].pid), time.time()
        time.sleep(seconds)
        cpu_pct = 100 * (tree_cpu_seconds(procs[0].pid) - before) / (time.time() - t)
    finally:
        stop_nodes(procs)
    return {
        "n": n, "seconds": seconds, "register_s": round(register_s, 2),
        "register_per_s": round(n / register_s), "redis_bytes_per_task": round(bytes_per_task),
        "node_cpu_pct": round(cpu_pct, 2), "processes": processes, **read_costs,
    }  # fmt: skip


async def _reads(url: str) -> dict[str, Any]:
    client = RedisClient.from_settings(url, RedisSection(url=url))
    try:
        return await reads.run(TaskStore(client, NAMESPACE))
    finally:
        await client.aclose()


async def _register(url: str, n: int) -> float:
    client = RedisClient.from_settings(url, RedisSection(url=url))
    store = TaskStore(client, NAMESPACE)
    later = await store.now_ms() + 86_400_000
    took = await register(
        store,
        [TaskSpec("bench", Schedule("interval", every_s=3600, start_ms=later)) for _ in range(n)],
    )
    await client.aclose()
    return took
