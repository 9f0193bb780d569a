"""The retry dispatcher: moves due retries back into their type's stream.

A failed fire below its max attempts is saved by its consumer as a retry context
(``{ns:P}:retry:<schedule_id>``) in the retry zset of its task's partition, scored by when
to retry. Per tick, like the poller and with the same claim-then-commit safety:

1. ``claim_retries.lua`` reserves due retries for ``claim_lease_ms``;
2. ``enqueue.lua`` appends them to ``queue:{type}`` with their attempt number and their
   original schedule_id (so a retry is recognisably the same fire);
3. ``commit_retries.lua`` deletes the contexts whose claim still holds.

A dispatcher killed between 1 and 3 leaves the retry to be claimed again after the lease:
late and maybe duplicated (same schedule_id and attempt, dropped by the consumer's dedupe
window), never lost.
"""

from __future__ import annotations

import secrets
from collections import defaultdict
from typing import Any

import trio

from actors.scheduling.poller import (
    PollerSettings,
    TickResult,
    claim_calls,
    partitions_for,
    sleep_s,
)
from actors.store import scripts
from actors.store.enqueue import Fire, enqueue_fires
from actors.store.keys import Keys
from actors.store.tasks import TaskStore
from runtime.actor import ActorContext, TaskStatus
from runtime.logging import emit_events


class RetryDispatcher:
    def __init__(self, store: TaskStore, settings: PollerSettings) -> None:
        self.store = store
        self.settings = settings
        self.actor = f"node/scheduler/retry-dispatcher-{settings.index}"
        self._token_base = secrets.token_hex(6)
        self._ticks = 0

    async def run(self, ctx: ActorContext, *, task_status: TaskStatus) -> None:
        keys = await self.store.keys()
        partitions = partitions_for(self.settings.index, self.settings.of, keys.partitions)
        self.actor = ctx.path
        ctx.log.info("retry_dispatcher_ready", partitions=partitions)
        task_status.started()
        while True:
            result = await self.tick(keys, partitions)
            await trio.sleep(sleep_s(result, self.settings.max_tick_s, self.settings.min_tick_s))

    async def tick(self, keys: Keys, partitions: list[int]) -> TickResult:
        self._ticks += 1
        token = f"{self._token_base}-{self._ticks}"
        calls = claim_calls(
            partitions, keys.retry, keys.retry_context_prefix, token,
            self.settings.batch_size, self.settings.claim_lease_ms,
        )  # fmt: skip
        replies = await self.store.client.scripts(scripts.CLAIM_RETRIES, calls)
        fires: list[Fire] = []
        claimed: dict[int, list[str]] = defaultdict(list)
        earliest: dict[int, int | None] = {}
        now = 0
        full = False
        for partition, reply in zip(partitions, replies, strict=True):
            if isinstance(reply, Exception):
                raise reply
            now = max(now, int(reply[0]))
            earliest[partition] = int(reply[1]) if int(reply[1]) >= 0 else None
            flat = reply[2:]
            full |= len(flat) // 6 >= self.settings.batch_size
            for i in range(0, len(flat), 6):
                sid, task_id, task_type, payload, attempt, due = flat[i : i + 6]
                claimed[partition].append(sid.decode())
                fires.append(
                    Fire(task_id.decode(), task_type.decode(), payload, int(due), int(attempt))
                )
        if fires:
            await enqueue_fires(
                self.store.client, keys, fires, now, self.actor, self.settings.dedupe_window_ms
            )
            earliest |= await self._commit(keys, claimed, token)
        seen = [e for e in earliest.values() if e is not None]
        return TickResult(len(fires), now, min(seen) if seen else None, full)

    async def _commit(
        self, keys: Keys, claimed: dict[int, list[str]], token: str
    ) -> dict[int, int | None]:
        calls = [
            ([keys.retry(p)], [keys.retry_context_prefix(p), token, *sids])
            for p, sids in claimed.items()
        ]
        replies = await self.store.client.scripts(scripts.COMMIT_RETRIES, calls)
        earliest: dict[int, int | None] = {}
        lost: list[tuple[str, dict[str, Any]]] = []
        for partition, reply in zip(claimed, replies, strict=True):
            if isinstance(reply, Exception):
                raise reply
            earliest[partition] = int(reply[0]) if int(reply[0]) >= 0 else None
            lost += [("retry_claim_lost", {"schedule_id": sid.decode()}) for sid in reply[1:]]
        emit_events(self.actor, lost)
        return earliest
