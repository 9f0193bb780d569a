"""A partition whose outcome writes Redis rejects holds back its own fires' completion only.

Redis rejects a batch's write in one partition (``rejected_alone``: a key there holding
another kind of value, a record no script can read) for as long as the key stays so.
Waited on like an outage, that one partition would hold up the whole completion of the
type on every node that runs one of its fires: a batch is acknowledged all or nothing,
later batches wait behind it under the pending lock, and then the reads. So the consumer
splits such a batch (``split``): its fires in the rejected partitions are held back here,
their messages pending under the consumer and renewed with the others in flight (never
run again), and the rest is written and acknowledged at once. The held fires are tried
again with a backoff (``HELD_RETRY_FIRST_S`` doubling to ``HELD_RETRY_CAP_S``), each try
sending only the writes not done yet, and acknowledged once theirs go through: the ACK
invariant holds fire by fire. ``completions_held_back`` says a partition's first held
fire, ``completions_resumed`` its last one completed.

At most ``HELD_MAX`` fires are held by one consumer: past that, a batch waits on the
rejection as on an outage (memory and each lease renewal stay bounded). A consumer that
stops with fires still held hands their messages back with the rest of what it holds:
another consumer runs them again (at least once).
"""

from __future__ import annotations

from collections.abc import Callable, Collection

import attrs
import trio

from actors.execution.completion import Completion, Outcome
from actors.execution.flight import Flight
from actors.store.completion_writes import CompletionWrite
from actors.store.scripts import Scripts
from runtime.errors import RedisUnavailable
from runtime.intensity import backoff_s
from runtime.logging import get_logger
from runtime.redis_replies import reply_text

#: Most fires one consumer holds back; past it a batch waits on the rejection.
HELD_MAX = 10_000
#: The first wait before held fires are tried again, and the longest.
HELD_RETRY_FIRST_S = 0.5
HELD_RETRY_CAP_S = 5.0

#: A batch being completed: its outcomes, what they turn into, and its write.
Batch = tuple[list[Outcome], Completion, CompletionWrite]
#: What says a settled batch's lines (the consumer's).
Say = Callable[[Completion, CompletionWrite], None]


def split(
    batch: Batch, partitions: Collection[int], partition_of: Callable[[str], int]
) -> tuple[Batch, Batch]:
    """``batch`` as (its fires in ``partitions``, the others), each with its share of the
    decision and of the write, the writes already done kept by both."""
    outcomes, plan, write = batch
    task_of = {o.message.msg_id: o.message.task_id for o in outcomes}

    def held(task_id: str) -> bool:
        return partition_of(task_id) in partitions

    return (
        _part(outcomes, plan, write, task_of, lambda t: held(t)),
        _part(outcomes, plan, write, task_of, lambda t: not held(t)),
    )


def _part(
    outcomes: list[Outcome], plan: Completion, write: CompletionWrite, task_of: dict[str, str],
    keep: Callable[[str], bool],
) -> Batch:  # fmt: skip
    ok = [i for i, values in enumerate(plan.finished) if keep(values[0])]
    part = Completion(
        results=[plan.results[i] for i in ok],
        retries=[r for r in plan.retries if keep(r.message.task_id)],
        outcomes=[o for o in plan.outcomes if keep(o.task_id)],
        dead=[d for d in plan.dead if keep(task_of[d.msg_id])],
        acks=[m for m in plan.acks if keep(task_of[m])],
        finished=[plan.finished[i] for i in ok],
        bodies=[plan.bodies[i] for i in ok],
        events=[e for e in plan.events if keep(e[1]["task_id"])],
        flights=[f for f in plan.flights if keep(f.task_id)],
    )
    part_write = CompletionWrite(
        write.task_type, retries=part.retries, outcomes=part.outcomes, dead=part.dead,
        acks=part.acks, flights=part.flights, ledger=write.ledger, written=set(write.written),
        alone=write.alone, paused=[p for p in write.paused if keep(p[0])],
    )  # fmt: skip
    return [o for o in outcomes if keep(o.message.task_id)], part, part_write


@attrs.define
class HeldBack:
    """The fires one consumer holds back, by batch, and the partitions they are in."""

    actor: str
    task_type: str
    partition_of: Callable[[str], int]
    batches: list[Batch] = attrs.field(factory=list)
    partitions: set[int] = attrs.field(factory=set)
    """Held partitions, each said once (``completions_held_back``) until resumed."""
    arrived: trio.Event = attrs.field(factory=trio.Event)

    def fires(self) -> int:
        return sum(len(b[0]) for b in self.batches)

    def room_for(self, count: int) -> bool:
        return self.fires() + count <= HELD_MAX

    def add(self, batch: Batch, rejected: dict[int, Exception]) -> None:
        """Hold ``batch`` back (its fires are in ``rejected``'s partitions)."""
        self.batches.append(batch)
        log = get_logger(actor=self.actor)
        for partition, error in sorted(rejected.items()):
            if partition not in self.partitions:
                self.partitions.add(partition)
                log.warning(
                    "completions_held_back", type=self.task_type, partition=partition,
                    error=reply_text(error), held=self.fires(),
                )  # fmt: skip
        self.arrived.set()

    def completed(self, done: list[Batch]) -> None:
        """``done`` went through: no longer held; a partition with nothing held resumes."""
        gone = {id(b) for b in done}
        self.batches = [b for b in self.batches if id(b) not in gone]
        still = {self.partition_of(o.message.task_id) for b in self.batches for o in b[0]}
        log = get_logger(actor=self.actor)
        for partition in sorted(self.partitions - still):
            self.partitions.discard(partition)
            log.info("completions_resumed", type=self.task_type, partition=partition)
        if not self.batches:
            self.arrived = trio.Event()

    async def retry_forever(
        self, lock: trio.Lock, scripts: Scripts, flight: Flight, say: Say
    ) -> None:
        """Try the fires held back again (``try_all`` under ``lock``, the consumer's
        pending lock), with a backoff, while any is held."""
        while True:
            await self.arrived.wait()
            tries = 0
            while self.batches:
                tries += 1
                await trio.sleep(backoff_s(tries, HELD_RETRY_FIRST_S, HELD_RETRY_CAP_S))
                async with lock:
                    await self.try_all(scripts, flight, say)

    async def try_all(self, scripts: Scripts, flight: Flight, say: Say) -> None:
        """One try at every batch held back, shielded as a flush's attempt is: those
        written in full are acknowledged, settled in ``flight`` and said (``say``)."""
        batches = list(self.batches)
        with trio.CancelScope(shield=True):
            try:
                errors = await scripts.complete([b[2] for b in batches])
            except RedisUnavailable:
                return  # an outage: the next try, after the next wait
        done = [b for b, error in zip(batches, errors, strict=True) if error is None]
        for outcomes, _, _ in done:
            flight.settled(outcomes)
        self.completed(done)
        for _, plan, write in done:
            say(plan, write)
