"""``python -m bench scrape N [SCRAPES]``: what one ``/metrics`` scrape costs a node with N
tasks: wall time, node CPU (over the node's idle CPU, measured just before) and Redis CPU
per scrape, with the gauge cache off (every scrape reads Redis); and what the periodic
count of tasks by status takes. ``Scraper`` also serves
``bench fire --scrape S`` (scrapes during a load run, for the lag A/B)."""

from __future__ import annotations

import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import trio

from bench.common import percentile, redis_cpu_seconds, tree_cpu_seconds


class Scraper:
    """GET a URL every ``every_s`` on a thread; keeps each scrape's wall time."""

    def __init__(self, url: str, every_s: float) -> None:
        self.url = url
        self.every_s = every_s
        self.times_ms: list[float] = []
        self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _loop(self) -> None:
        with httpx.Client(timeout=10) as client:
            while not self._stop.wait(self.every_s):
                started = time.perf_counter()
                try:
                    client.get(self.url).raise_for_status()
                    self.times_ms.append((time.perf_counter() - started) * 1000)
                except httpx.HTTPError:
                    self.failures += 1

    def figures(self) -> dict[str, Any]:
        ms = sorted(self.times_ms)
        return {
            "count": len(ms), "failures": self.failures, "every_s": self.every_s,
            "p50_ms": round(percentile(ms, 50), 2) if ms else None,
            "p99_ms": round(percentile(ms, 99), 2) if ms else None,
        }  # fmt: skip


def run(url: str, n: int, scrapes: int) -> dict[str, Any]:
    from bench.fire import start_nodes, stop_nodes
    from bench.idle import _register
    from runtime.testing.local_redis import free_port

    register_s = trio.run(_register, url, n)
    workdir = Path(tempfile.mkdtemp(prefix="metronome-bench-scrape-"))
    port = free_port()
    procs = start_nodes(workdir, url, 1, 10, "info", metrics_port=port)
    target = f"http://127.0.0.1:{port}/metrics"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(target, timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        time.sleep(3.0)
        pid = procs[0].pid
        idle_s = 10.0
        before = tree_cpu_seconds(pid)
        time.sleep(idle_s)
        idle_rate = (tree_cpu_seconds(pid) - before) / idle_s
        cpu_before, redis_before, t = tree_cpu_seconds(pid), redis_cpu_seconds(url), time.time()
        times = []
        with httpx.Client(timeout=10) as client:
            for _ in range(scrapes):
                started = time.perf_counter()
                body = client.get(target).text
                times.append((time.perf_counter() - started) * 1000)
                time.sleep(0.1)
        elapsed = time.time() - t
        node_cpu = tree_cpu_seconds(pid) - cpu_before - idle_rate * elapsed
        redis_cpu = redis_cpu_seconds(url) - redis_before
    finally:
        stop_nodes(procs)
    times.sort()
    count_s, cpu_s, counts = trio.run(_count_statuses, url)
    return {
        "n": n, "scrapes": scrapes, "register_s": round(register_s, 1),
        "scrape_p50_ms": round(percentile(times, 50), 2),
        "scrape_p99_ms": round(percentile(times, 99), 2),
        "node_cpu_ms_per_scrape": round(1000 * node_cpu / scrapes, 2),
        "redis_cpu_ms_per_scrape": round(1000 * redis_cpu / scrapes, 3),
        "node_idle_cpu_pct": round(100 * idle_rate, 2),
        "exposition_bytes": len(body),
        "status_count_s": round(count_s, 2), "status_count_cpu_s": round(cpu_s, 2),
        "status_counts": counts,
    }  # fmt: skip


async def _count_statuses(url: str) -> tuple[float, float, dict[str, int]]:
    """What the periodic ``metronome_tasks`` count costs (the same code as a node's)."""
    from actors.store.tasks import TaskStore
    from bench.fire import NAMESPACE
    from runtime.config import RedisSection
    from runtime.redis_io import RedisClient

    client = RedisClient.from_settings(url, RedisSection(url=url))
    store = TaskStore(client, NAMESPACE)
    started, cpu = time.perf_counter(), time.process_time()
    counts = await store.count_by_status()
    took, cpu_used = time.perf_counter() - started, time.process_time() - cpu
    await client.aclose()
    return took, cpu_used, counts
