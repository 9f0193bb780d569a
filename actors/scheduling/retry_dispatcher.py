"""The retry dispatcher: moves due retries back into their type's stream.

A failed fire below its max attempts is saved by its consumer as a retry context
(``{ns:P}:retry:<schedule_id>``) in the retry zset of its task's partition, scored by when
to retry. Per tick, like the poller and with the same claim-then-commit safety:

1. ``claim_retries.lua`` reserves due retries for ``claim_lease_ms``;
2. ``enqueue.lua`` appends them to ``queue:{type}`` with their attempt number and their
   original schedule_id (so a retry is recognisably the same fire);
3. ``commit_retries.lua`` deletes the contexts whose claim still holds.

A retry whose task was deleted or stopped since its fire failed is dropped at step 1
(``retry_dropped``): a stop is final, and a deleted task fires no more. A paused or
finished task's retry runs: its fire had started.

A partition whose claim Redis rejects (its keys of another kind), or a type whose stream
it rejects, holds back its own retries only (``retries_held_back``, once): the others are
claimed, appended and committed; an outage or a refusal of every write is waited out.

A dispatcher killed between 1 and 3 leaves the retry to be claimed again after the lease:
late, never lost, and appended once within ``dedupe_window_s`` (the new claim names the
old one as prior, and ``enqueue.lua`` finds what it appended; with the window off, maybe
twice). One stalled past the lease between 1 and 2 (a
frozen process) may append a retry another dispatcher took over and appended: a
duplicate, recognisable by its schedule_id and attempt, as for a stalled poller.
"""

from __future__ import annotations

import secrets
from collections import defaultdict
from collections.abc import Mapping, Sequence

import attrs
import trio

from actors.scheduling.claim_loop import (
    ClaimLoopSettings,
    CommittedClaims,
    TickResult,
    earliest,
    partitions_for,
    sleep_s,
)
from actors.scheduling.rejections import Notices, append_by_type
from actors.store.enqueue import enqueue_fires
from actors.store.replies import Fire
from actors.store.scripts import Scripts
from actors.store.tasks import TaskStore
from runtime.actor import ActorContext, TaskStatus
from runtime.logging import emit_events, get_logger
from runtime.redis_replies import PartRejected


@attrs.frozen
class RetryDispatcherSettings(ClaimLoopSettings):
    """The retry dispatcher's settings: ``index`` of ``of`` dispatchers, batch, leases."""


class RetryDispatcher:
    def __init__(self, store: TaskStore, settings: RetryDispatcherSettings) -> None:
        self.store = store
        self.settings = settings
        self.actor = f"node/scheduler/retry-dispatcher-{settings.index}"
        self._token_base = secrets.token_hex(6)
        self._ticks = 0
        self._committed = CommittedClaims()
        """Claims committed in full whose enqueue markers go with the next enqueue."""
        self._notices = Notices(self.actor, "retries_held_back", "retries_resumed")

    async def run(self, ctx: ActorContext, *, task_status: TaskStatus) -> None:
        task_status.started()  # before waiting for Redis: the node starts its other roles
        redis = self.store.client
        keys = await redis.ride_out(self.store.keys)
        scripts = await self.store.scripts()
        partitions = partitions_for(self.settings.index, self.settings.of, keys.partitions)
        self.actor = self._notices.actor = ctx.path
        ctx.log.info("retry_dispatcher_ready", partitions=partitions)
        while True:
            result = await redis.ride_out(lambda: self.tick(scripts, partitions), ctx.path)
            shortest = min(self.settings.min_tick_s, self.settings.max_batch_delay_s)
            await trio.sleep(sleep_s(result, self.settings.max_tick_s, shortest))

    async def tick(self, scripts: Scripts, partitions: list[int]) -> TickResult:
        self._ticks += 1
        token = f"{self._token_base}-{self._ticks}"
        s = self.settings
        rejected: list[PartRejected] = []
        claims = await scripts.claim_retries(
            partitions, token, s.batch_size, s.claim_lease_ms, rejected
        )
        self._notices.say(
            "partition", {str(r.part): r.error for r in rejected}, map(str, partitions)
        )
        emit_events(
            self.actor,
            [
                ("retry_dropped", {
                    "task_id": sid.rpartition(":")[0], "schedule_id": sid,
                    "reason": "task deleted or stopped",
                })
                for c in claims
                for sid in c.dropped
            ],
        )  # fmt: skip
        for sid in (sid for c in claims for sid in c.unreadable):  # named each lease
            get_logger(actor=self.actor).warning(
                "retry_unreadable", schedule_id=sid,
                fix="its retry context lacks a field, holds no text or no type name where "
                "one goes, or no number: mend or delete it (left as it is, named again a "
                "claim lease later)",
            )  # fmt: skip
        fires: list[Fire] = []
        sids: list[str] = []
        claimed: dict[int, list[str]] = defaultdict(list)
        earliest_ms = {c.partition: c.earliest_ms for c in claims}
        for claim in claims:
            for sid, fire in claim.retries:
                claimed[claim.partition].append(sid)
                fires.append(fire)
                sids.append(sid)
        now = max((c.now_ms for c in claims), default=0)
        if fires:
            # Claimed: ride out an outage with the same token (see the poller's tick).
            redis = scripts.client
            types = {f.type for f in fires}
            committed = self._committed.take(types)
            refused_types = await self._enqueue(scripts, fires, now, token, committed)
            if refused_types:  # left claimed: taken again after the lease, tried again
                types -= refused_types
                queued = {sid for sid, f in zip(sids, fires, strict=True) if f.type in types}
                claimed = {p: [i for i in ids if i in queued] for p, ids in claimed.items()}
            commits = await redis.ride_out(lambda: scripts.commit_retries(token, claimed))
            lost = [
                ("retry_claim_lost", {"schedule_id": sid})
                for c in commits.values()
                for sid in c.lost
            ]
            emit_events(self.actor, lost)
            if not lost and s.dedupe_window_ms > 0:
                self._committed.add(token, types)
            earliest_ms |= {p: c.earliest_ms for p, c in commits.items()}
        full = any(len(c.retries) >= s.batch_size for c in claims)
        return TickResult(len(fires), now, earliest(list(earliest_ms.values())), full)

    async def _enqueue(
        self, scripts: Scripts, fires: list[Fire], now: int, token: str,
        committed: Mapping[str, Sequence[str]],
    ) -> set[str]:  # fmt: skip
        """Append the retries (``enqueue_fires``), riding out outages and refusals. A
        type's stream that Redis rejects (a key of another kind, say) holds back that
        type's retries only: the others are appended type by type
        (``rejections.append_by_type``; all at once first when the markers make a repeat
        safe). The types held back."""
        window = self.settings.dedupe_window_ms

        async def append(group: list[Fire]) -> int:
            return await enqueue_fires(scripts, group, now, self.actor, window, token, committed)

        rejected = await append_by_type(scripts.client, append, fires, at_once=window > 0)
        self._notices.say("type", rejected, {f.type for f in fires})
        return set(rejected)
