"""The poller (the seed's "metronome"): moves due tasks into their type's stream.

One tick, for the partitions this poller serves, in three round trips whatever the number
of due tasks (each a pipeline of one script call per partition):

1. **claim** (``claim_due.lua``): reserve up to ``batch_size`` due tasks per partition for
   ``claim_lease_ms``, reading Redis's clock, and get their definitions back;
2. **enqueue**: XADD one message per fire to ``queue:{type}`` (the misfire policy decides
   how many fires a late task gets);
3. **commit** (``commit_fires.lua``): advance each task's grid only if this poller's claim
   still holds.

Invariant: a task's grid time moves only after its message is in the stream. A poller
killed between 1 and 3 leaves the claim to expire; the task is then claimed again with the
same grid time, so the fire is late and maybe duplicated (with the same schedule_id) but
never lost. Competing pollers (on this node or others) never claim the same task at once.

Between ticks the poller sleeps until the earliest due time it saw, at most ``max_tick_s``;
a full batch means more is due, so it loops at once. Its work per tick is proportional to
what is due, never to the number of tasks.
"""

from __future__ import annotations

import secrets
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import attrs
import structlog
import trio

from actors.domain.schedules import FirePlan, Schedule, plan_fires
from actors.store import scripts
from actors.store.enqueue import Fire, enqueue_fires
from actors.store.keys import Keys, schedule_id
from actors.store.records import decode_schedule
from actors.store.tasks import TaskStore
from runtime.actor import ActorContext, TaskStatus
from runtime.logging import emit_events


@attrs.frozen
class PollerSettings:
    """Settings of a claim loop over partitions: the poller's, and the retry dispatcher's
    (``actors.scheduling.retry_dispatcher``), which ticks the same way over retry zsets."""

    index: int = 0
    of: int = 1
    batch_size: int = 1000
    max_tick_s: float = 0.25
    min_tick_s: float = 0.0
    claim_lease_ms: int = 10_000
    dedupe_window_ms: int = 60_000


@attrs.frozen
class Claimed:
    """One task claimed for this tick, as ``claim_due.lua`` returns it."""

    task_id: str
    bucket: int
    type: str
    payload: bytes
    schedule: Schedule
    due_ms: int
    fires: int
    owed_until_ms: int | None = None
    """It still held an earlier poller's claim, which blocked it until then: that poller
    died before committing, so the grid times due meanwhile are owed fires
    (``plan_fires(owed_until_ms=...)``)."""


@attrs.frozen
class PartitionClaim:
    partition: int
    now_ms: int
    earliest_ms: int | None
    tasks: list[Claimed]


@attrs.frozen
class TickResult:
    enqueued: int
    now_ms: int
    earliest_ms: int | None
    full: bool
    """Some partition returned a full batch: more may be due right now."""


def partitions_for(index: int, of: int, partitions: int) -> list[int]:
    """The partitions actor ``index`` of ``of`` serves: p with p % of == index."""
    return [p for p in range(partitions) if p % of == index]


def claim_calls(
    partitions: list[int],
    zset_of: Callable[[int], str],
    prefix_of: Callable[[int], str],
    token: str,
    limit: int,
    lease_ms: int,
    *extra: Any,
) -> list[tuple[list[str], list[Any]]]:
    """One claim script call per partition (claim_due.lua and claim_retries.lua share this
    form): KEYS = the partition's zset; ARGV = its prefix, token, limit, lease, extra..."""
    return [([zset_of(p)], [prefix_of(p), token, limit, lease_ms, *extra]) for p in partitions]


def sleep_s(result: TickResult, max_tick_s: float, min_tick_s: float = 0.0) -> float:
    """Until the earliest due time seen, within [min_tick_s, max_tick_s]; 0 if a batch was
    full (more is due now)."""
    if result.full:
        return 0.0
    if result.earliest_ms is None:
        return max_tick_s
    wait_s = (result.earliest_ms - result.now_ms) / 1000
    return min(max_tick_s, max(min_tick_s, wait_s))


def _owed_until(raw: Any) -> int | None:
    """claim_due.lua's owed_until: a score (bytes, as Redis formats it) or the integer -1."""
    value = int(float(raw))
    return None if value < 0 else value


def _misfired(task: Claimed, plan: FirePlan) -> dict[str, Any]:
    return {
        "task_id": task.task_id,
        "schedule_id": schedule_id(task.task_id, task.due_ms),
        "type": task.type,
        "policy": task.schedule.misfire,
        "missed": plan.missed,
        "fired": len(plan.fires),
        "due_ms": task.due_ms,
    }


class Poller:
    def __init__(self, store: TaskStore, settings: PollerSettings) -> None:
        self.store = store
        self.settings = settings
        self.actor = f"node/scheduler/poller-{settings.index}"
        # Short: the token sits in each claimed task's state record (under 64 bytes)
        self._token_base = secrets.token_hex(4)
        self._ticks = 0
        self._schedules: dict[bytes, Schedule] = {}

    async def run(self, ctx: ActorContext, *, task_status: TaskStatus) -> None:
        """Actor: tick until cancelled."""
        keys = await self.store.keys()
        partitions = self.partitions(keys)
        self.actor = ctx.path
        ctx.log.info(
            "poller_ready", partitions=partitions, of=keys.partitions, buckets=keys.buckets
        )
        task_status.started()
        while True:
            result = await self.tick(keys, partitions, ctx.log)
            await trio.sleep(self.sleep_s(result))

    def partitions(self, keys: Keys) -> list[int]:
        return partitions_for(self.settings.index, self.settings.of, keys.partitions)

    def sleep_s(self, result: TickResult) -> float:
        return sleep_s(result, self.settings.max_tick_s, self.settings.min_tick_s)

    async def tick(
        self, keys: Keys, partitions: list[int], log: structlog.typing.FilteringBoundLogger
    ) -> TickResult:
        """Claim, enqueue and commit everything due now in ``partitions``."""
        self._ticks += 1
        token = f"{self._token_base}-{self._ticks}"
        claims = await self._claim(keys, partitions, token)
        now = max(c.now_ms for c in claims) if claims else 0
        plans: dict[int, list[tuple[Claimed, FirePlan]]] = defaultdict(list)
        messages: list[tuple[Claimed, int]] = []
        events: list[tuple[str, dict[str, Any]]] = []
        for claim in claims:
            for task in claim.tasks:
                events.append(
                    (
                        "scheduled",
                        {
                            "task_id": task.task_id,
                            "schedule_id": schedule_id(task.task_id, task.due_ms),
                            "type": task.type,
                            "due_ms": task.due_ms,
                        },
                    )
                )
                plan = plan_fires(
                    task.schedule,
                    task.due_ms,
                    claim.now_ms,
                    task.fires,
                    owed_until_ms=task.owed_until_ms,
                )
                plans[claim.partition].append((task, plan))
                messages += [(task, due) for due in plan.fires]
                if plan.missed:
                    events.append(("misfired", _misfired(task, plan)))
        emit_events(self.actor, events)
        if messages:
            # Nothing is committed if this raises: the claims expire and the fires come back.
            fires = [Fire(t.task_id, t.type, t.payload, due) for t, due in messages]
            await enqueue_fires(
                self.store.client, keys, fires, now, self.actor, self.settings.dedupe_window_ms
            )
        earliest_by_partition = {c.partition: c.earliest_ms for c in claims}
        if plans:
            # After a commit the partition's earliest due time is the committed one.
            earliest_by_partition |= await self._commit(keys, plans, token, log)
        earliest = [e for e in earliest_by_partition.values() if e is not None]
        return TickResult(
            enqueued=len(messages),
            now_ms=now,
            earliest_ms=min(earliest) if earliest else None,
            full=any(len(c.tasks) >= self.settings.batch_size for c in claims),
        )

    async def _claim(self, keys: Keys, partitions: list[int], token: str) -> list[PartitionClaim]:
        calls = claim_calls(
            partitions, keys.schedule, keys.tag, token,
            self.settings.batch_size, self.settings.claim_lease_ms, keys.buckets,
        )  # fmt: skip
        replies = await self.store.client.scripts(scripts.CLAIM_DUE, calls)
        claims = []
        for partition, reply in zip(partitions, replies, strict=True):
            if isinstance(reply, Exception):
                raise reply
            claims.append(self._decode_claim(partition, reply))
        return claims

    def _decode_claim(self, partition: int, reply: list[Any]) -> PartitionClaim:
        now, earliest, flat = int(reply[0]), int(reply[1]), reply[2:]
        tasks = [
            Claimed(
                task_id=flat[i].decode(),
                bucket=int(flat[i + 1]),
                type=flat[i + 2].decode(),
                payload=flat[i + 3],
                schedule=self._schedule(flat[i + 4]),
                due_ms=int(flat[i + 5]),
                fires=int(flat[i + 6]),
                owed_until_ms=_owed_until(flat[i + 7]),
            )
            for i in range(0, len(flat), 8)
        ]
        return PartitionClaim(partition, now, earliest if earliest >= 0 else None, tasks)

    def _schedule(self, raw: bytes) -> Schedule:
        """Decode a stored schedule; many tasks share a few distinct schedules, so cache."""
        schedule = self._schedules.get(raw)
        if schedule is None:
            if len(self._schedules) > 10_000:
                self._schedules.clear()
            schedule = decode_schedule(raw)
            self._schedules[raw] = schedule
        return schedule

    async def _commit(
        self,
        keys: Keys,
        plans: dict[int, list[tuple[Claimed, FirePlan]]],
        token: str,
        log: structlog.typing.FilteringBoundLogger,
    ) -> dict[int, int | None]:
        """Commit the plans; return each committed partition's earliest due time."""
        calls = []
        for partition, items in plans.items():
            args: list[Any] = [keys.tag(partition), token]
            for task, plan in items:
                if plan.next_ms is None:
                    args += [task.task_id, task.bucket, "", "", len(plan.fires)]
                else:
                    score = plan.next_ms + task.schedule.jitter_ms()
                    args += [task.task_id, task.bucket, plan.next_ms, score, len(plan.fires)]
            calls.append(([keys.schedule(partition)], args))
        replies = await self.store.client.scripts(scripts.COMMIT_FIRES, calls)
        earliest: dict[int, int | None] = {}
        for partition, reply in zip(plans, replies, strict=True):
            if isinstance(reply, Exception):
                raise reply
            earliest[partition] = int(reply[0]) if int(reply[0]) >= 0 else None
            for lost in reply[1:]:
                log.warning("claim_lost", task_id=lost.decode())
        return earliest
