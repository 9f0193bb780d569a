"""The execution roles' scripts: the consumer's begin, complete (ACK, retries, outcomes,
dead letters in one pipeline), leases and name, and the claimer's reclaim, prune and trim.
A part of ``actors.store.scripts.Scripts``; nothing else uses it alone."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from actors.store import lua
from actors.store.flights import (
    ENDED_DEAD,
    FlightEnd,
    FlightScripts,
    ended_flights,
    origin_of,
    paused_of,
)
from actors.store.history import Ledger
from actors.store.keys import GROUP
from actors.store.messages import Message, flat_fields
from actors.store.records import pack_array
from actors.store.replies import (
    DeadLetterWrite,
    OutcomeWrite,
    Reclaim,
    Reclaimed,
    RetryWrite,
)
from actors.store.task_scripts import Call, or_empty, raise_first_error

#: Most stream entries one ``trim_acked.lua`` call drops (whole listpack nodes of ~100: a
#: call frees ~1,000 nodes, well under a millisecond); ``trim_acked`` repeats it while
#: it takes some, so a stream is trimmed to its acknowledged head at any rate.
TRIM_STEP = 100_000
#: The error line of a poison message's history entry.
POISON_LINE = (
    "poison: delivered too many times without finishing (its handler kills or hangs its process)"
)
#: Most such calls one ``trim_acked`` makes (the rest waits for the claimer's next round).
TRIM_CALLS = 20


class ExecutionScripts(FlightScripts):
    """The consumer's and claimer's scripts, as typed async methods."""

    # -- execution: consumer ----------------------------------------------------------------

    async def begin_runs(
        self, task_type: str, messages: Sequence[Message], window_ms: int
    ) -> list[bool]:
        """``begin_runs.lua``: per message, True to run it, False for a duplicate fire."""
        args: list[Any] = [self.keys.seen_prefix(task_type), window_ms]
        for m in messages:
            args += [m.msg_id, m.fire_key]
        (flags,) = await self._run([(lua.BEGIN_RUNS, [self.keys.queue(task_type)], args)])
        return [bool(int(flag)) for flag in flags]

    def _ack_call(self, task_type: str, ids: Sequence[str]) -> Call:
        return (lua.ACK, [self.keys.queue(task_type)], [GROUP, *ids])

    def _dead_letter_call(self, task_type: str, entries: Sequence[DeadLetterWrite]) -> Call:
        args: list[Any] = [GROUP]
        for entry in entries:
            flat = [x for kv in entry.fields.items() for x in kv]
            args += [entry.msg_id, len(flat), *flat]
        return (lua.DEAD_LETTER, [self.keys.queue(task_type), self.keys.dlq(task_type)], args)

    async def ack(self, task_type: str, ids: Sequence[str]) -> int:
        """``ack.lua``: acknowledge finished messages; how many were pending (the entries
        are trimmed later, ``trim_acked``)."""
        if not ids:
            return 0
        (count,) = await self._run([self._ack_call(task_type, ids)])
        return int(count)

    async def dead_letter(self, task_type: str, entries: Sequence[DeadLetterWrite]) -> list[str]:
        """``dead_letter.lua``: move messages to the DLQ with their ACK; the DLQ entry ids
        ('' for a message no longer pending: it gets no second dead letter)."""
        if not entries:
            return []
        (ids,) = await self._run([self._dead_letter_call(task_type, entries)])
        return [i.decode() for i in ids]

    def _retry_call(self, partition: int, retries: Sequence[RetryWrite]) -> Call:
        k = self.keys
        args: list[Any] = [k.retry_context_prefix(partition)]
        for r in retries:
            m = r.message
            args += [
                m.schedule_id, r.delay_ms, m.task_id, m.type, m.payload_json,
                m.attempt + 1, m.due_ms, r.error, m.policy,
            ]  # fmt: skip
        return (lua.SCHEDULE_RETRIES, [k.retry(partition)], args)

    def _outcomes_call(
        self, partition: int, outcomes: Sequence[OutcomeWrite], task_type: str, ledger: Ledger
    ) -> Call:
        k = self.keys
        rows: list[Any] = []
        for o in outcomes:
            rows += [
                o.task_id, str(k.bucket_of(o.task_id)), o.outcome, o.finished_ms, o.error, o.due_ms,
                "" if o.started_ms is None else o.started_ms, o.attempt, o.origin, o.line,
                "" if o.allowed_ms is None else o.allowed_ms,
            ]  # fmt: skip
        args = [
            k.tag(partition),
            ledger.keep,
            ledger.node,
            ledger.late_ms,
            task_type,
            pack_array(rows),
        ]
        return (lua.RECORD_OUTCOMES, [k.schedule(partition)], args)

    async def schedule_retries(self, retries: Sequence[RetryWrite]) -> None:
        """``schedule_retries.lua`` per partition: save retry contexts, scored by retry time."""
        await self._run(self._partition_calls(retries, [], "", Ledger()))

    async def record_outcomes(
        self, outcomes: Sequence[OutcomeWrite], task_type: str = "", ledger: Ledger | None = None
    ) -> int:
        """``record_outcomes.lua`` per partition: each task's last run and its history
        entry; how many updated."""
        calls = self._partition_calls([], outcomes, task_type, ledger or Ledger())
        return sum(int(r) for r in await self._run(calls))

    def _partition_calls(
        self,
        retries: Sequence[RetryWrite],
        outcomes: Sequence[OutcomeWrite],
        task_type: str,
        ledger: Ledger,
    ) -> list[Call]:
        retry_by: dict[int, list[RetryWrite]] = defaultdict(list)
        for r in retries:
            retry_by[self.keys.partition_of(r.message.task_id)].append(r)
        outcome_by: dict[int, list[OutcomeWrite]] = defaultdict(list)
        for o in outcomes:
            outcome_by[self.keys.partition_of(o.task_id)].append(o)
        return [self._retry_call(p, rs) for p, rs in retry_by.items()] + [
            self._outcomes_call(p, os, task_type, ledger) for p, os in outcome_by.items()
        ]

    async def complete(
        self,
        task_type: str,
        *,
        retries: Sequence[RetryWrite],
        outcomes: Sequence[OutcomeWrite],
        dead: Sequence[DeadLetterWrite],
        acks: Sequence[str],
        written: set[int] | None = None,
        flights: Sequence[FlightEnd] = (),
        paused: list[tuple[str, int]] | None = None,
        ledger: Ledger | None = None,
    ) -> None:
        """A consumer's batch of outcomes, in the order that keeps the ACK invariant:
        retry contexts and task outcomes first, then dead letters and ACKs, only once every
        one of those writes succeeded. Two round trips (in one hop to the I/O thread), on
        one server too: a pipeline runs every command, so an ACK pipelined behind a refused
        write (``OOM``, ``MISCONF``, a key of the wrong type) would be acknowledged with its
        retry never written. A write that fails raises here with nothing acknowledged.

        ``written``: the partition writes of this batch that went through on an earlier
        attempt (by index; this call adds to it), so that an attempt repeated after a
        refusal sends only the rest: a retry context written again after the dispatcher
        took it would run that attempt twice. (After a lost connection nothing is known
        and every write is sent again.) Dead letters are safe to repeat: one is written
        only while its message is pending.

        ``flights``: fires of tasks with a policy that ended (``end_flights.lua``, with the
        partition writes); ``paused`` gets the tasks that paused for their failures.
        ``ledger``: the history's length, this node's number and the type's lateness
        bound (``actors.store.history``)."""
        done = written if written is not None else set()
        partition_calls = self._partition_calls(retries, outcomes, task_type, ledger or Ledger())
        flight_calls = len(partition_calls)
        partition_calls += self.end_flight_calls(flights)
        todo = [i for i in range(len(partition_calls)) if i not in done]
        stream_calls = ([self._dead_letter_call(task_type, dead)] if dead else []) + (
            [self._ack_call(task_type, acks)] if acks else []
        )
        first, then = await self.client.scripts_in_order(
            [partition_calls[i] for i in todo], stream_calls
        )
        done.update(
            i for i, reply in zip(todo, first, strict=True) if not isinstance(reply, Exception)
        )
        if paused is not None and flights:
            paused += paused_of(
                [r for i, r in zip(todo, first, strict=True)
                 if i >= flight_calls and not isinstance(r, Exception)]
            )  # fmt: skip
        raise_first_error([*first, *(then or ())])

    async def renew_leases(self, task_type: str, consumer: str, ids: Sequence[str]) -> list[str]:
        """``renew_leases.lua``: reset the idle time of our own in-flight messages."""
        if not ids:
            return []
        (renewed,) = await self._run(
            [(lua.RENEW_LEASES, [self.keys.queue(task_type)], [GROUP, consumer, *ids])]
        )
        return [i.decode() for i in renewed]

    async def release(self, task_type: str, consumer: str, idle_ms: int) -> tuple[list[str], bool]:
        """``release.lua``: hand back everything pending under ``consumer`` with ``idle_ms``;
        (released ids, whether the consumer left the group)."""
        ((released, removed),) = await self._run(
            [(lua.RELEASE, [self.keys.queue(task_type)], [GROUP, consumer, idle_ms])]
        )
        return [i.decode() for i in released], bool(int(removed))

    async def own_name(
        self, task_type: str, consumer: str, owner: str, ttl_ms: int, take_from: str = ""
    ) -> tuple[bool, str | None]:
        """``own_name.lua``: (True, None) when ``consumer`` is now ours for ``ttl_ms``, else
        (False, the holder's owner value)."""
        (reply,) = await self._run(
            [(lua.OWN_NAME, [self.keys.owner(task_type, consumer)], [owner, ttl_ms, take_from])]
        )
        return (True, None) if int(reply[0]) else (False, reply[1].decode())

    async def disown_name(self, task_type: str, consumer: str, owner: str) -> bool:
        """``disown_name.lua``: give the name up if it is still ours."""
        (reply,) = await self._run(
            [(lua.DISOWN_NAME, [self.keys.owner(task_type, consumer)], [owner])]
        )
        return bool(int(reply))

    async def node_number(self, node: str) -> int:
        """``node_number.lua``: the number ``node``'s name goes by in task histories."""
        (number,) = await self._run([(lua.NODE_NUMBER, [self.keys.node_numbers], [node])])
        return int(number)

    async def recover(
        self, task_type: str, consumer: str, count: int, min_idle_ms: int = 0
    ) -> list[Reclaimed]:
        """``recover.lua``: claim back what is pending under ``consumer`` with at least
        ``min_idle_ms`` of idle time (idle reset, delivery count kept), as (id, fields)."""
        (entries,) = await self._run(
            [(lua.RECOVER, [self.keys.queue(task_type)], [GROUP, consumer, count, min_idle_ms])]
        )
        return [
            Reclaimed(msg_id.decode(), consumer, 0, 0, flat_fields(fields))
            for msg_id, fields in entries
        ]

    # -- execution: claimer -----------------------------------------------------------------

    async def reclaim(
        self, task_type: str, consumer: str, lease_ms: int, count: int, max_deliveries: int,
        node: str, sent_ms: int | None = None, max_delay_ms: int = 0,
    ) -> Reclaim:  # fmt: skip
        """``reclaim.lua``: take over up to ``count`` messages idle past the lease for
        ``consumer``; dead-letter those delivered ``max_deliveries`` times (poison).
        ``sent_ms``: the caller's reading of Redis's clock as it sends the call; when the
        call runs more than ``max_delay_ms`` later (Redis paused or stalled in between),
        it takes nothing (``Reclaim.stalled``)."""
        k = self.keys
        args = [GROUP, consumer, lease_ms, count, max_deliveries, node, task_type]
        args += [or_empty(sent_ms), max_delay_ms]
        ((claimed, poisoned, stalled, now_ms, ended),) = await self._run(
            [(lua.RECLAIM, [k.queue(task_type), k.dlq(task_type)], args)]
        )
        return Reclaim(
            claimed=[
                Reclaimed(
                    msg_id.decode(), owner.decode(), int(idle), int(deliveries), flat_fields(fields)
                )
                for msg_id, owner, idle, deliveries, fields in claimed
            ],
            poisoned=[m.decode() for m in poisoned],
            stalled=bool(int(stalled)),
            now_ms=int(now_ms),
            ended=ended_flights(ended, ENDED_DEAD, 4),
            dead=[
                OutcomeWrite(
                    ended[i].decode(), 2, int(now_ms), POISON_LINE, int(ended[i + 1]),
                    attempt=int(ended[i + 3]), origin=origin_of(ended[i + 2].decode()),
                    line=POISON_LINE,
                )
                for i in range(0, len(ended), 4)
                if ended[i + 1].isdigit() and ended[i + 3].isdigit()  # a hand-written entry
            ],
        )  # fmt: skip

    async def prune_consumers(self, task_type: str, min_idle_ms: int, keep: str) -> list[str]:
        """``prune_consumers.lua``: remove consumers idle that long with nothing pending
        (never ``keep``); their names."""
        (removed,) = await self._run(
            [(lua.PRUNE_CONSUMERS, [self.keys.queue(task_type)], [GROUP, min_idle_ms, keep])]
        )
        return [r.decode() for r in removed]

    async def trim_acked(self, task_type: str, step: int = TRIM_STEP) -> int:
        """``trim_acked.lua``: drop the stream's acknowledged entries from its head, about
        ``step`` a call (whole nodes: a call may take a little less), calling again until
        one takes nothing or ``TRIM_CALLS`` have run; how many went."""
        total = 0
        for _ in range(TRIM_CALLS):
            (trimmed,) = await self._run(
                [(lua.TRIM_ACKED, [self.keys.queue(task_type)], [GROUP, step])]
            )
            if not int(trimmed):
                break
            total += int(trimmed)
        return total
