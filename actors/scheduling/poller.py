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
from typing import Any

import attrs
import structlog
import trio

from actors.domain.schedules import FirePlan, plan_fires
from actors.scheduling.claim_loop import (
    ClaimLoopSettings,
    TickResult,
    earliest,
    partitions_for,
    sleep_s,
)
from actors.store.enqueue import enqueue_fires
from actors.store.keys import Keys, schedule_id
from actors.store.replies import Claimed, Fire, FireCommit
from actors.store.scripts import Scripts
from actors.store.tasks import TaskStore
from runtime.actor import ActorContext, TaskStatus
from runtime.logging import debug_enabled, emit_events


@attrs.frozen
class PollerSettings(ClaimLoopSettings):
    """The poller's settings: ``index`` of ``of`` pollers, its batch, ticks and leases."""


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

    async def run(self, ctx: ActorContext, *, task_status: TaskStatus) -> None:
        """Actor: tick until cancelled."""
        redis = self.store.client
        keys = await redis.ride_out(self.store.keys)
        scripts = await self.store.scripts()
        partitions = self.partitions(keys)
        self.actor = ctx.path
        ctx.log.info(
            "poller_ready", partitions=partitions, of=keys.partitions, buckets=keys.buckets
        )
        task_status.started()
        while True:
            # Redis away: wait and tick again; what was claimed and not committed comes back
            # after the claim lease, so a repeated tick loses nothing.
            result = await redis.ride_out(lambda: self.tick(scripts, partitions, ctx.log))
            await trio.sleep(self.sleep_s(result))

    def partitions(self, keys: Keys) -> list[int]:
        return partitions_for(self.settings.index, self.settings.of, keys.partitions)

    def sleep_s(self, result: TickResult) -> float:
        return sleep_s(result, self.settings.max_tick_s, self.settings.min_tick_s)

    async def tick(
        self, scripts: Scripts, partitions: list[int], log: structlog.typing.FilteringBoundLogger
    ) -> TickResult:
        """Claim, enqueue and commit everything due now in ``partitions``."""
        self._ticks += 1
        token = f"{self._token_base}-{self._ticks}"
        s = self.settings
        claims = await scripts.claim_due(partitions, token, s.batch_size, s.claim_lease_ms)
        now = max(c.now_ms for c in claims) if claims else 0
        plans: dict[int, list[tuple[Claimed, FirePlan]]] = defaultdict(list)
        messages: list[tuple[Claimed, int]] = []
        scheduled: list[tuple[str, dict[str, Any]]] = []
        misfired: list[tuple[str, dict[str, Any]]] = []
        debug = debug_enabled()
        for claim in claims:
            for task in claim.tasks:
                if debug:
                    scheduled.append(
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
                    misfired.append(("misfired", _misfired(task, plan)))
        # One info line per fire is written when it ends (the consumer's, with every
        # lifecycle time); the claim's own line is a debug line.
        if scheduled:
            emit_events(self.actor, scheduled, level="debug")
        if misfired:
            emit_events(self.actor, misfired)
        # From here on the claims are ours: if Redis goes away, the tick waits for it and
        # goes on with the same token rather than leave its claims to expire (a lease later).
        # An enqueue repeated after a lost reply finds its own markers and answers as
        # before; a commit checks the claim still holds.
        redis = scripts.client
        if messages:
            # Nothing is committed if this raises: the claims expire and the fires come back.
            fires = [
                Fire(t.task_id, t.type, t.payload, due, prior=t.prior_claim) for t, due in messages
            ]
            await redis.ride_out(
                lambda: enqueue_fires(scripts, fires, now, self.actor, s.dedupe_window_ms, token)
            )
        earliest_by_partition = {c.partition: c.earliest_ms for c in claims}
        if plans:
            # After a commit the partition's earliest due time is the committed one.
            earliest_by_partition |= await redis.ride_out(
                lambda: self._commit(scripts, plans, token, log)
            )
        return TickResult(
            enqueued=len(messages),
            now_ms=now,
            earliest_ms=earliest(list(earliest_by_partition.values())),
            full=any(len(c.tasks) >= s.batch_size for c in claims),
        )

    async def _commit(
        self,
        scripts: Scripts,
        plans: dict[int, list[tuple[Claimed, FirePlan]]],
        token: str,
        log: structlog.typing.FilteringBoundLogger,
    ) -> dict[int, int | None]:
        """Commit the plans; return each committed partition's earliest due time."""
        commits = {
            partition: [
                FireCommit(
                    task.task_id,
                    task.bucket,
                    plan.next_ms,
                    None if plan.next_ms is None else plan.next_ms + task.schedule.jitter_ms(),
                    len(plan.fires),
                )
                for task, plan in items
            ]
            for partition, items in plans.items()
        }
        done = await scripts.commit_fires(token, commits)
        for commit in done.values():
            for lost in commit.lost:
                log.warning("claim_lost", task_id=lost)
        return {partition: commit.earliest_ms for partition, commit in done.items()}
