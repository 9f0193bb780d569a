"""Presence: each process of each node says, every few seconds, that it is alive and how
its actors are (running, down and why, restarts), in one field of ``ns:nodes``.

The dashboard's node view and ``GET /v1/nodes`` read it. A process removes its field when
it stops; one killed leaves its last report, which readers show as gone once it is older
than ``GONE_AFTER_S`` and delete after ``FORGET_AFTER_S``. One ``HSET`` per process every
``INTERVAL_S``: nothing per fire. The same beat lays the namespace's meta key down again
if it is gone (``TaskStore.keep_meta``), so a node started after Redis lost it reads the
namespace's counts rather than being refused.
"""

from __future__ import annotations

import json
import os
from typing import Any

import trio

from actors.store.tasks import TaskStore
from runtime.actor import ActorContext, TaskStatus
from runtime.errors import RedisUnavailable

INTERVAL_S = 5.0
GONE_AFTER_S = 3 * INTERVAL_S
FORGET_AFTER_S = 600.0


class Presence:
    def __init__(self, store: TaskStore, process: str) -> None:
        self.store = store
        self.process = process
        """The process's name: the node's, or ``node/part`` in a child process."""

    def report(self, ctx: ActorContext, now_ms: int) -> dict[str, Any]:
        return {
            "process": self.process,
            "pid": os.getpid(),
            "seen_ms": now_ms,
            "up": ctx.health.up(),
            "down": ctx.health.down(local_only=True),
            "restarts": dict(ctx.health.restarts),
        }

    async def publish(self, ctx: ActorContext) -> None:
        keys = await self.store.keys()
        report = self.report(ctx, await self.store.now_ms())
        await self.store.client.execute("HSET", keys.nodes, self.process, json.dumps(report))
        await self.store.keep_meta()

    async def run(self, ctx: ActorContext, *, task_status: TaskStatus) -> None:
        task_status.started()
        try:
            while True:
                await self.store.client.ride_out(lambda: self.publish(ctx))
                await trio.sleep(INTERVAL_S)
        finally:
            with trio.move_on_after(2) as cleanup:
                cleanup.shield = True
                try:
                    keys = await self.store.keys()
                    await self.store.client.execute("HDEL", keys.nodes, self.process)
                except RedisUnavailable:
                    pass  # readers age the report out


async def read_nodes(store: TaskStore) -> list[dict[str, Any]]:
    """Every process's last report, newest first, each with ``age_ms`` and ``alive``;
    reports older than ``FORGET_AFTER_S`` are deleted."""
    keys = await store.keys()
    now = await store.now_ms()
    raw = await store.client.execute("HGETALL", keys.nodes)
    reports, stale = [], []
    for field, text in (raw or {}).items():
        try:
            report = json.loads(text)
            age = now - int(report["seen_ms"])
        except (ValueError, KeyError, TypeError, OverflowError, RecursionError):  # 1e400, depth
            stale.append(field)  # not a report this version wrote: drop it
            continue
        if age > FORGET_AFTER_S * 1000:
            stale.append(field)
            continue
        reports.append({**report, "age_ms": max(0, age), "alive": age <= GONE_AFTER_S * 1000})
    if stale:
        await store.client.execute("HDEL", keys.nodes, *stale)
    return sorted(reports, key=lambda r: str(r.get("process")))
