"""The consumers' batches of outcomes as Redis writes: one batch alone, or the batches of
every consumer of a process at once (``actors.execution.completion_group``).

A batch writes per partition (retry contexts, task outcomes, ended flights: one script call
each) and then per stream (dead letters, ACKs). Batches written together share their
outcome calls: the outcomes of ten types' batches that fall in one partition are one
``record_outcomes.lua`` call, not ten, so a node's Redis calls and their CPU follow the
partitions a flush touches, not the partitions times the types. Within a shared call each
batch's rows succeed or fail on their own (the script runs each group under ``pcall``).

A batch remembers each partition write of its own that went through
(``CompletionWrite.written``), so an attempt repeated after a refusal sends only the
writes not done yet, whichever batches it is sent with. A write that failed partway may
have applied its first rows, which the repeat writes again: at least once, as for a batch
alone. A batch's stream writes go only once every partition write of that batch went
through: the ACK invariant, batch by batch.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import attrs

from actors.store.flights import FlightEnd
from actors.store.history import Ledger
from actors.store.replies import DeadLetterWrite, OutcomeWrite, RetryWrite

#: A partition write: (kind, partition, history length, node number); the last two are the
#: outcome calls' (0 for the others), whose batches share a call only when they agree.
Part = tuple[str, int, int, int]
RETRIES, OUTCOMES, FLIGHTS = "retries", "outcomes", "flights"


@attrs.define(eq=False)
class CompletionWrite:
    """One consumer's batch of outcomes, as ``ExecutionScripts.complete`` writes it, and what
    its attempts have done so far."""

    task_type: str
    retries: Sequence[RetryWrite] = ()
    outcomes: Sequence[OutcomeWrite] = ()
    dead: Sequence[DeadLetterWrite] = ()
    acks: Sequence[str] = ()
    """Message ids acknowledged plainly (dead letters are acknowledged by their script)."""
    flights: Sequence[FlightEnd] = ()
    """Fires of tasks with a policy that ended (``end_flights.lua``)."""
    cancels_done: Sequence[str] = ()
    """Schedule ids of ended ``cancel_other`` fires: their cancel requests are removed
    with the ACKs (``ack.lua``)."""
    ledger: Ledger = attrs.field(factory=Ledger)
    """The history's length, this node's number and the type's lateness bound."""
    written: set[Part] = attrs.field(factory=set)
    """The partition writes known to have gone through on an earlier attempt: a repeat
    sends only the rest (a retry context written again after the dispatcher took it would
    run that attempt twice). A write whose reply a lost connection took is not known, and
    is sent again."""
    alone: bool = False
    """Written apart from other batches from now on: its writes could not be built (a
    value that does not encode), so its error reaches its own consumer only."""
    paused: list[tuple[str, int]] = attrs.field(factory=list)
    """The tasks its ended flights paused for their failures, with their dead streaks."""
    rejected: dict[int, Exception] = attrs.field(factory=dict)
    """The partitions whose write Redis rejected on the last attempt (``rejected_alone``:
    a key there holding another kind of value), with the reply: the consumer holds those
    partitions' fires back and completes the rest (``actors.execution.held_back``)."""

    def parts(self, partition_of: Any) -> dict[Part, list[Any]]:
        """What this batch writes in each partition write not done yet: its retries,
        outcomes or ended flights there."""
        retries: dict[int, list[Any]] = defaultdict(list)
        for r in self.retries:
            retries[partition_of(r.message.task_id)].append(r)
        outcomes: dict[int, list[Any]] = defaultdict(list)
        for o in self.outcomes:
            outcomes[partition_of(o.task_id)].append(o)
        flights: dict[int, list[Any]] = defaultdict(list)
        for e in self.flights:
            flights[partition_of(e.task_id)].append(e)
        ledger = self.ledger
        parts: dict[Part, list[Any]] = {}
        for kind, by, keep, node in (
            (RETRIES, retries, 0, 0),
            (OUTCOMES, outcomes, ledger.keep, ledger.node),
            (FLIGHTS, flights, 0, 0),
        ):
            for partition, items in by.items():
                part = (kind, partition, keep, node)
                if part not in self.written:
                    parts[part] = items
        return parts


@attrs.define
class Shared:
    """One partition write and the batches that have a part in it."""

    part: Part
    shares: list[tuple[CompletionWrite, list[Any]]] = attrs.field(factory=list)


def shared_parts(writes: Sequence[CompletionWrite], partition_of: Any) -> list[Shared]:
    """The partition writes of ``writes`` not done yet, each with its batches' parts, in
    the order the batches name them. Only outcome calls are shared: each type's rows in one
    run under their own ``pcall`` (``record_outcomes.lua``), so one batch's failing row
    fails its own batch alone; a batch's retry contexts and ended flights go in calls of
    their own, which fail or succeed for it alone."""
    shared: dict[Any, Shared] = {}
    for write in writes:
        for part, items in write.parts(partition_of).items():
            key = part if part[0] == OUTCOMES else (part, id(write))
            shared.setdefault(key, Shared(part)).shares.append((write, items))
    return list(shared.values())


def paused_by_write(
    paused: Sequence[tuple[str, int]], shares: Sequence[tuple[CompletionWrite, list[Any]]]
) -> None:
    """Give each batch of one ``end_flights.lua`` call the paused tasks of the flights it
    ended in it."""
    owner = {e.task_id: w for w, ends in shares for e in ends}
    for task_id, streak in paused:
        write = owner.get(task_id)
        if write is not None:
            write.paused.append((task_id, streak))
