"""A partition whose outcome writes Redis rejects holds back its own fires' completion only.

Redis rejects a batch's write in one partition (``rejected_alone``: a key there holding
another kind of value, a read Redis refuses) for as long as the key stays so.
Waited on like an outage, that one partition would hold up the whole completion of the
type on every node that runs one of its fires: a batch is acknowledged all or nothing,
later batches wait behind it under the pending lock, and then the reads. So the consumer
splits such a batch (``split``): its fires in the rejected partition are held back here,
their messages pending under the consumer and renewed with the others in flight, and the
rest is written and acknowledged at once.

Each held partition keeps its batches in order, and a later batch's fires of that
partition join the queue without being tried: a consumer writes a task's outcomes in the
order its fires ran there (its last run, its history), never a later fire's before an
earlier one's. (Fires of one task that ran on different consumers, each holding some,
are written as each consumer's tries go through once the key is mended.)
The queues' heads are tried again with a backoff (``HELD_RETRY_FIRST_S`` doubling to
``HELD_RETRY_CAP_S``), each try sending only the writes not done yet; a head written in
full is acknowledged and the next one tried at once: the ACK invariant holds fire by
fire. ``completions_held_back`` says a partition's first held fire (per consumer),
``completions_resumed`` its last one completed.

At most ``HELD_MAX`` fires are held by one consumer: past that, a batch waits on the
rejection as on an outage (memory and each lease renewal stay bounded), trying the held
ones at each of its tries. Held messages are pending, so the stream is not trimmed past
the oldest of them. A consumer that stops with fires still held hands their messages back
with the rest of what it holds: another consumer runs them again (at least once).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping

import attrs
import trio
from redis.exceptions import ResponseError

from actors.execution.completion import Completion, Outcome
from actors.execution.flight import Flight
from actors.store.completion_writes import CompletionWrite
from actors.store.scripts import Scripts
from runtime.errors import RedisUnavailable
from runtime.intensity import backoff_s
from runtime.logging import get_logger
from runtime.redis_replies import rejected_alone, reply_text

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
    inside = {o.message.task_id: partition_of(o.message.task_id) in partitions for o in outcomes}
    return (
        _part(outcomes, plan, write, task_of, inside.__getitem__),
        _part(outcomes, plan, write, task_of, lambda t: not inside[t]),
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
        cancels_done=[sid for sid in plan.cancels_done if keep(sid.rpartition(":")[0])],
    )
    part_write = CompletionWrite(
        write.task_type, retries=part.retries, outcomes=part.outcomes, dead=part.dead,
        acks=part.acks, flights=part.flights, cancels_done=part.cancels_done,
        ledger=write.ledger, written=set(write.written),
        alone=write.alone, paused=[p for p in write.paused if keep(p[0])],
    )  # fmt: skip
    return [o for o in outcomes if keep(o.message.task_id)], part, part_write


@attrs.define
class HeldBack:
    """The fires one consumer holds back: per partition, its batches in order."""

    actor: str
    task_type: str
    partition_of: Callable[[str], int]
    queues: dict[int, list[Batch]] = attrs.field(factory=dict)
    """Held partitions (each said once, ``completions_held_back``, until resumed), each
    with its batches, oldest first."""
    errors: dict[int, Exception] = attrs.field(factory=dict)
    """The last rejection each held queue met."""
    arrived: trio.Event = attrs.field(factory=trio.Event)

    def fires(self) -> int:
        return sum(len(b[0]) for queue in self.queues.values() for b in queue)

    def room_for(self, count: int) -> bool:
        return self.fires() + count <= HELD_MAX

    def behind(self, batch: Batch) -> set[int]:
        """The held partitions ``batch`` has fires in: they go behind the held ones."""
        if not self.queues:
            return set()
        return {self.partition_of(o.message.task_id) for o in batch[0]} & self.queues.keys()

    def crowded(self, batch: Batch) -> set[int]:
        """The held partitions ``batch`` has fires in when there is no room to hold them
        (empty otherwise): it must not go ahead of them, nor join them."""
        behind = self.behind(batch)
        return behind if behind and not self.room_for(self.count_in(batch, behind)) else set()

    def count_in(self, batch: Batch, partitions: Collection[int]) -> int:
        """How many of ``batch``'s fires are in ``partitions``."""
        return sum(self.partition_of(o.message.task_id) in partitions for o in batch[0])

    def hold(self, batch: Batch, errors: Mapping[int, Exception | None], flight: Flight) -> Batch:
        """Hold back ``batch``'s fires in the partitions of ``errors`` (the rejection each
        met, or none yet: the fires join a held queue untried), one batch a partition at
        the end of its queue; what is left of ``batch``. Their messages stay in ``flight``
        (renewed), no longer awaited as settling (``Flight.held_back``)."""
        log = get_logger(actor=self.actor)
        for partition, error in sorted(errors.items()):
            held, batch = split(batch, (partition,), self.partition_of)
            if not held[0]:
                continue
            flight.held_back(held[0])
            if error is not None:
                self.errors[partition] = error
            if partition not in self.queues:
                self.queues[partition] = []
                log.warning(
                    "completions_held_back", type=self.task_type, partition=partition,
                    error=reply_text(error) if error else "", held=self.fires() + len(held[0]),
                )  # fmt: skip
            self.queues[partition].append(held)
        if self.queues:
            self.arrived.set()
        return batch

    def rejection(self, partitions: Collection[int]) -> Exception:
        """The last rejection a held queue of ``partitions`` met: raised for a batch that
        must wait behind it (no room to hold its fires), so that ``ride_out`` waits."""
        found = [self.errors[p] for p in sorted(partitions) if p in self.errors]
        # a new one each time: raising one instance again and again grows its traceback
        return ResponseError(str(found[0]) if found else "fires held back in this partition")

    async def retry_forever(
        self, lock: trio.Lock, scripts: Scripts, flight: Flight, say: Say
    ) -> None:
        """Try the fires held back again (``try_all`` under ``lock``, the consumer's
        pending lock), with a backoff, while any is held."""
        while True:
            await self.arrived.wait()
            self.arrived = trio.Event()  # set again by the next ``hold``
            tries = 0
            while self.queues:
                tries += 1
                await trio.sleep(backoff_s(tries, HELD_RETRY_FIRST_S, HELD_RETRY_CAP_S))
                async with lock:
                    await self.try_all(scripts, flight, say)

    async def try_all(self, scripts: Scripts, flight: Flight, say: Say) -> None:
        """Try each held partition's oldest batch, shielded as a flush's attempt is; after
        one written in full (acknowledged, settled in ``flight`` and said by ``say``), the
        next one of that partition at once, until a round writes none. A head still
        rejected is not sent again in the same call (each send writes again the rows a
        partly failed write applied)."""
        log = get_logger(actor=self.actor)
        wanted: Collection[int] = list(self.queues)
        while wanted:
            heads = [self.queues[p][0] for p in wanted]
            errors = await self._write(scripts, heads)
            if errors is None:
                return
            done = [b for b, error in zip(heads, errors, strict=True) if error is None]
            for batch, error in zip(heads, errors, strict=True):
                if error is not None and rejected_alone(error):
                    self.errors[self.partition_of(batch[0][0].message.task_id)] = error
            wanted = []
            for batch in done:
                outcomes = batch[0]
                flight.settled(outcomes)
                partition = self.partition_of(outcomes[0].message.task_id)
                queue = self.queues[partition]
                queue.pop(0)
                if queue:
                    wanted.append(partition)
                else:
                    del self.queues[partition]
                    self.errors.pop(partition, None)
                    log.info("completions_resumed", type=self.task_type, partition=partition)
            for _, plan, write in done:
                say(plan, write)
            broken = next((e for e in errors if e is not None and not _answered(e)), None)
            if broken is not None:
                raise broken  # a batch that cannot be built: the consumer fails, as on a flush

    async def _write(self, scripts: Scripts, heads: list[Batch]) -> list[Exception | None] | None:
        """``heads``' writes (``ExecutionScripts.complete``), shielded; each alone when
        together they cannot be built (a value that does not encode), so one such batch
        holds back no other (its error in its place). None after an outage (the next try,
        after the next wait)."""
        with trio.CancelScope(shield=True):
            try:
                return await scripts.complete([b[2] for b in heads])
            except RedisUnavailable:
                return None
            except Exception as exc:  # not Redis's answer about a partition
                if len(heads) == 1:
                    return [exc]
                alone: list[Exception | None] = []
                for head in heads:
                    answer = await self._write(scripts, [head])
                    if answer is None:
                        return None
                    alone += answer
                return alone
        return None  # not reached: the scope is shielded


def _answered(error: Exception) -> bool:
    """Whether ``error`` is Redis's answer to a write (a rejection, a refusal, an outage),
    not a write that could not be built."""
    return isinstance(error, (ResponseError, RedisUnavailable))
