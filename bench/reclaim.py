"""``python -m bench reclaim K LEASE_S``: how long after a ``kill -9`` another node runs
the killed node's messages.

Node A (poller and consumer) starts K handlers that record their start and then sleep;
node B (consumer only) waits idle. A is killed with SIGKILL; the figure is, per message,
B's start time minus the kill time. Expected: about the lease (idle counts from A's last
renewal, every lease/3) plus the claimer's tick.
"""

from __future__ import annotations

import glob
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

from actors.domain.model import TaskSpec
from actors.domain.schedules import Schedule
from actors.store.tasks import TaskStore
from bench.common import percentile
from bench.fire import NAMESPACE, start_nodes, stop_nodes
from runtime.config import RedisSection
from runtime.redis_io import RedisClient


def run(url: str, k: int, lease_s: float) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="metronome-bench-reclaim-"))
    trio.run(_register, url, k)
    options: dict[str, Any] = {"handler": "bench.handlers:hold", "lease_s": lease_s}
    a = start_nodes(workdir, url, 1, k, "info", **options)[0]
    b = None
    try:
        _wait(lambda: len(_starts(workdir, a.pid)) >= k, 60)
        b = start_nodes(workdir, url, 1, k, "info", first=1, **options)[0]
        _wait(lambda: "consumer_ready" in (workdir / "node-1.log").read_text(), 60)
        kill_ms = time.time() * 1000
        a.send_signal(signal.SIGKILL)
        a.wait()
        _wait(lambda: len(_starts(workdir, b.pid)) >= k, lease_s * 3 + 30)
        latencies = [t - kill_ms for t in _starts(workdir, b.pid)]
    finally:
        stop_nodes([p for p in (a, b) if p is not None])
    return {
        "messages": k, "lease_s": lease_s,
        "reclaim_p50_ms": round(percentile(latencies, 50)),
        "reclaim_max_ms": round(max(latencies)),
        "reclaimed": len(latencies),
    }  # fmt: skip


async def _register(url: str, k: int) -> None:
    client = RedisClient.from_settings(url, RedisSection(url=url))
    store = TaskStore(client, NAMESPACE)
    await store.create_many(
        [TaskSpec("bench", Schedule("once", at_ms=0), {"sleep_s": 600}) for _ in range(k)]
    )
    await client.aclose()


def _starts(workdir: Path, pid: int) -> list[float]:
    found: list[float] = []
    for path in glob.glob(str(workdir / f"fires-{pid}.txt")):
        with open(path) as lines:
            found += [float(line.split()[2]) for line in lines if line.strip()]
    return found


def _wait(predicate: Any, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit("bench reclaim: timed out waiting for the nodes")
        time.sleep(0.02)
