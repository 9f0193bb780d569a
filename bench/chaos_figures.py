"""What a ``bench chaos`` run counts once its nodes have stopped: duplicates a fault
explains and those it does not, the first fresh fire after the faults, the nodes' telling
log lines, the tasks stored, the dead letters expected."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import redis
import redis.cluster

from bench.fire import NAMESPACE
from bench.handlers import DOOMED

#: A fire due this close to a fault (before or after) may be in flight when it strikes.
REACH_MS = 15_000


def fault_figures(workdir: Path, faults: list[tuple[float, float]]) -> dict[str, Any]:
    """Duplicates split by whether a fault explains them; time to the first fresh fire."""
    starts: dict[tuple[str, int, int], list[float]] = {}
    for path in workdir.glob("fires-*.txt"):
        for line in path.read_text().splitlines():
            task_id, due_text, start, *attempt = line.split()
            key = (task_id, int(due_text), int(attempt[0]) if attempt else 0)
            starts.setdefault(key, []).append(float(start))
    explained = unexplained = 0
    for (_task, due, _attempt), times in starts.items():
        if len(times) < 2:
            continue
        near = any(s * 1000 - REACH_MS <= due <= e * 1000 + REACH_MS for s, e in faults)
        explained += near
        unexplained += not near
    ran_during = sum(
        1 for (_, due, _), times in starts.items()
        if any(s * 1000 <= due and min(times) <= e * 1000 for s, e in faults)
    )  # fmt: skip
    fresh: list[float] = []
    if faults:
        end_ms = max(e for _, e in faults) * 1000
        fresh = [min(t) - end_ms for (_, due, _), t in starts.items() if due >= end_ms]
    logs = [p.read_text(errors="replace") for p in workdir.glob("node-*.log")]
    return {
        "reclaimed": sum(text.count('"event":"reclaimed"') for text in logs),
        "actor_crashes": sum(text.count('"event":"actor_crashed"') for text in logs),
        "redis_refused": sum(text.count('"event":"redis_refused"') for text in logs),
        "retry_unreadable": sum(text.count('"event":"retry_unreadable"') for text in logs),
        "poison_held": sum(text.count('"event":"poison_held"') for text in logs),
        "duplicates_explained": explained,
        "duplicates_unexplained": unexplained,
        "first_fresh_fire_s": round(min(fresh) / 1000, 3) if fresh else None,
        "ran_during_faults": ran_during,
    }


def count_tasks(url: str, cluster: bool = False) -> int:
    """Tasks stored in the bench namespace: definitions across every bucket."""
    client: Any = redis.cluster.RedisCluster.from_url(url) if cluster else redis.Redis.from_url(url)
    try:
        meta = client.hgetall(f"{NAMESPACE}:meta")
        partitions, buckets = int(meta[b"partitions"]), int(meta[b"buckets"])
        pipe = client.pipeline(transaction=False)
        for p in range(partitions):
            for b in range(buckets):
                pipe.hlen(f"{{{NAMESPACE}:{p}}}:def:{b}")
        return sum(int(x) for x in pipe.execute())
    finally:
        client.close()


def doomed_fires(workdir: Path) -> int:
    """The fires of the doomed tasks that started (each one dead letter)."""
    fires = set()
    for path in workdir.glob("fires-*.txt"):
        for line in path.read_text().splitlines():
            task_id, due, *_ = line.split()
            if task_id in DOOMED:
                fires.add((task_id, due))
    return len(fires)
