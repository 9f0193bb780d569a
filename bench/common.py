"""What every benchmark mode shares: a Redis to measure against, memory and CPU readings."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Iterator
from typing import Any

import redis

from runtime.embedded_redis import find_server_binary
from runtime.testing.local_redis import RedisProcess


@contextlib.contextmanager
def redis_for_bench(url: str | None) -> Iterator[str]:
    if url:
        yield url
        return
    server = RedisProcess(find_server_binary()).start()
    try:
        yield server.url
    finally:
        server.remove()


def used_memory(url: str) -> int:
    client = redis.Redis.from_url(url)
    try:
        return int(client.info("memory")["used_memory"])
    finally:
        client.close()


def redis_cpu_times(url: str) -> tuple[float, float]:
    """A Redis server's own CPU time, from one ``INFO cpu``: (user + system, system). The
    system part is mostly socket I/O: it shrinks with fewer, larger round trips."""
    client = redis.Redis.from_url(url)
    try:
        info = client.info("cpu")
        system = float(info["used_cpu_sys"])
        return float(info["used_cpu_user"]) + system, system
    finally:
        client.close()


def redis_cpu_seconds(url: str) -> float:
    """A Redis server's own CPU time (user + system)."""
    return redis_cpu_times(url)[0]


def command_stats(url: str) -> dict[str, tuple[int, float]]:
    """A Redis server's ``INFO commandstats``: command -> (calls, microseconds). Commands
    run inside scripts are counted too, which shows what a script's time is made of."""
    client = redis.Redis.from_url(url)
    try:
        info = client.info("commandstats")
        return {
            name.removeprefix("cmdstat_"): (int(v["calls"]), float(v["usec"]))
            for name, v in info.items()
        }
    finally:
        client.close()


def command_costs(
    before: list[dict[str, tuple[int, float]]],
    after: list[dict[str, tuple[int, float]]],
    fires: float,
) -> dict[str, list[float]]:
    """Per fire, summed over servers: command -> [calls, microseconds], the costliest first
    (those under 0.05 us a fire left out)."""
    total: dict[str, list[float]] = {}
    for b, a in zip(before, after, strict=True):
        for name, (calls, usec) in a.items():
            c0, u0 = b.get(name, (0, 0.0))
            row = total.setdefault(name, [0.0, 0.0])
            row[0] += calls - c0
            row[1] += usec - u0
    rows = sorted(total.items(), key=lambda kv: -kv[1][1])
    return {
        name: [round(calls / fires, 2), round(usec / fires, 2)]
        for name, (calls, usec) in rows
        if usec / fires >= 0.05
    }


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, from /proc."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def child_pids(pid: int) -> list[int]:
    """The live child processes of ``pid`` (a node's ``[processes]``)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited meanwhile
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(entry))
    return found


def tree_cpu_seconds(pid: int) -> float:
    """``cpu_seconds`` of a process and its live child processes (a node's ``[processes]``)."""
    total = cpu_seconds(pid)
    for child in child_pids(pid):
        try:
            total += cpu_seconds(child)
        except OSError:
            continue  # exited meanwhile
    return total


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def emit(result: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(result, separators=(",", ":")) + "\n")
    sys.stdout.flush()
