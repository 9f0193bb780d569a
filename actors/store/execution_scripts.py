"""The execution roles' scripts: the consumer's begin, complete (ACK, retries, outcomes,
dead letters in one pipeline), leases and name, and the claimer's reclaim, prune and trim.
A part of ``actors.store.scripts.Scripts``; nothing else uses it alone."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from msgpack import packb, unpackb
from redis.exceptions import ResponseError

from actors.store import lua
from actors.store.completion_writes import (
    FLIGHTS,
    OUTCOMES,
    RETRIES,
    CompletionWrite,
    Shared,
    paused_by_write,
    shared_parts,
)
from actors.store.flights import (
    ENDED_DEAD,
    LETTER_OF_ORIGIN,
    FlightEnd,
    FlightScripts,
    ended_flights,
    origin_of,
    paused_of,
    with_origin,
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
from actors.store.task_scripts import Call, or_empty
from runtime.redis_io import Reply
from runtime.redis_replies import classify, rejected_alone

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

    def _ack_call(self, task_type: str, ids: Sequence[str], cancels: Sequence[str] = ()) -> Call:
        if cancels:
            keys = [self.keys.queue(task_type), self.keys.cancels(task_type)]
            return (lua.ACK, keys, [GROUP, len(ids), *ids, *cancels])
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
        args: list[Any] = [k.retry_context_prefix(partition), k.tag(partition), k.buckets]
        for r in retries:
            m = r.message
            args += [
                m.schedule_id, r.delay_ms, m.task_id, m.type, m.payload_json,
                m.attempt + 1, m.due_ms, r.error, m.policy,
            ]  # fmt: skip
        return (lua.SCHEDULE_RETRIES, [k.retry(partition)], args)

    def _outcomes_call(
        self,
        partition: int,
        groups: Sequence[tuple[str, int, Sequence[OutcomeWrite]]],
        keep: int,
        node: int,
    ) -> Call:
        """``record_outcomes.lua`` for ``partition``: each group's outcomes, with its type
        and lateness bound."""
        k = self.keys
        types: list[Any] = []
        rows: list[Any] = []
        for task_type, late_ms, outcomes in groups:
            types += [task_type, late_ms, len(outcomes)]
            for o in outcomes:
                rows += [
                    o.task_id, str(k.bucket_of(o.task_id)), o.outcome, o.finished_ms, o.error,
                    o.due_ms, "" if o.started_ms is None else o.started_ms, o.attempt, o.origin,
                    o.line, "" if o.allowed_ms is None else o.allowed_ms,
                ]  # fmt: skip
        args = [k.tag(partition), keep, node, pack_array(types), pack_array(rows)]
        return (lua.RECORD_OUTCOMES, [k.schedule(partition)], args)

    def _shared_call(self, shared: Shared) -> Call:
        """The script call of one partition write, with every batch's part in it."""
        kind, partition, keep, node = shared.part
        if kind == OUTCOMES:
            groups = [(w.task_type, w.ledger.late_ms, items) for w, items in shared.shares]
            return self._outcomes_call(partition, groups, keep, node)
        items = [item for _, part in shared.shares for item in part]
        if kind == RETRIES:
            return self._retry_call(partition, items)
        return self.end_flight_call(partition, items)

    def _stream_calls(self, write: CompletionWrite) -> list[Call]:
        """A batch's stream writes: its dead letters, then its ACKs (and the cancel
        requests its ended ``cancel_other`` fires leave)."""
        return ([self._dead_letter_call(write.task_type, write.dead)] if write.dead else []) + (
            [self._ack_call(write.task_type, write.acks, write.cancels_done)]
            if write.acks or write.cancels_done
            else []
        )

    async def schedule_retries(self, retries: Sequence[RetryWrite]) -> None:
        """``schedule_retries.lua`` per partition: save retry contexts, scored by retry time."""
        shared = shared_parts([CompletionWrite("", retries=retries)], self.keys.partition_of)
        await self._run([self._shared_call(s) for s in shared])

    async def record_outcomes(
        self, outcomes: Sequence[OutcomeWrite], task_type: str = "", ledger: Ledger | None = None
    ) -> int:
        """``record_outcomes.lua`` per partition: each task's last run and its history
        entry; how many updated."""
        write = CompletionWrite(task_type, outcomes=outcomes, ledger=ledger or Ledger())
        shared = shared_parts([write], self.keys.partition_of)
        total = 0
        for reply in await self._run([self._shared_call(s) for s in shared]):
            for updated, error in zip(reply, self._group_errors(reply), strict=True):
                if error is not None:
                    raise error
                total += int(updated)
        return total

    def _group_errors(self, reply: Any) -> list[Exception | None]:
        """``record_outcomes.lua``'s reply: each group's error (None: written in full; a
        group's count is an integer, its error a string)."""
        return [
            None
            if isinstance(group, int)
            else classify(
                ResponseError(group.decode() if isinstance(group, bytes) else str(group)),
                self.client.description,
            )
            for group in reply
        ]

    async def complete(self, writes: Sequence[CompletionWrite]) -> list[Exception | None]:
        """Consumers' batches of outcomes (``actors.store.completion_writes``), in the order
        that keeps the ACK invariant: retry contexts, task outcomes and ended flights first,
        then a batch's dead letters and ACKs, only once every one of its own writes before
        succeeded. Two round trips (in one hop to the I/O thread), on one server too: a
        pipeline runs every command, so an ACK pipelined behind a refused write (``OOM``,
        ``MISCONF``, a key of the wrong type) would be acknowledged with its retry never
        written. Per batch, the first write that failed (nothing of that batch was
        acknowledged), else None.

        Each batch's ``written`` gets the partition writes that went through, as soon as
        the first round's replies are in (so a lost connection in the second round sends
        none of them again, nor does an outage met in the first: a transient reply or a
        Cluster master lost mid-call, raised as ``RedisUnavailable`` only once the other
        replies are settled), and its ``paused`` the tasks its ended flights paused. The
        outcomes of several batches in one call succeed or fail batch by batch
        (``record_outcomes.lua`` replies per group); retry contexts and ended flights go in
        calls of each batch's own. Dead letters are safe to repeat: one is written only
        while its message is pending."""
        shared = shared_parts(writes, self.keys.partition_of)
        errors: dict[int, Exception] = {}
        sent: list[tuple[CompletionWrite, int]] = []
        for w in writes:
            w.rejected = {}

        def then(replies: list[Reply]) -> list[Call]:
            for s, reply in zip(shared, replies, strict=True):
                self._settle(s, reply, errors)
            calls: list[Call] = []
            for w in writes:
                if id(w) not in errors:
                    stream = self._stream_calls(w)
                    sent.append((w, len(stream)))
                    calls += stream
            return calls

        _, second = await self.client.scripts_in_order([self._shared_call(s) for s in shared], then)
        at = 0
        for w, count in sent:
            error = next((r for r in second[at : at + count] if isinstance(r, Exception)), None)
            if error is not None:
                errors.setdefault(id(w), error)
                # the dead-letter call alone: with the ACKs refused too, it is the stream
                stream_ok = count < 2 or not isinstance(second[at + 1], Exception)
                if w.dead and second[at] is error and stream_ok and rejected_alone(error):
                    self._dead_letters_rejected(w, error)
            at += count
        return [errors.get(id(w)) for w in writes]

    def _dead_letters_rejected(self, write: CompletionWrite, error: Exception) -> None:
        """The type's dead-letter stream rejected ``write``'s dead letters (a key of
        another kind): noted as a rejection of their tasks' partitions, so the consumer
        holds back those fires (``actors.execution.held_back``) and completes the rest,
        rather than waiting with every later batch of the type behind this one. Its other
        fires were acknowledged with it (a pipeline runs every command; a dead letter is
        acknowledged only by its own script)."""
        for entry in write.dead:
            task_id = entry.fields.get("task_id")
            if isinstance(task_id, str):
                write.rejected.setdefault(self.keys.partition_of(task_id), error)

    def _settle(self, shared: Shared, reply: Reply, errors: dict[int, Exception]) -> None:
        """What one partition write's reply means for each batch with a part in it (a
        rejection also noted as the batch's ``rejected`` partition)."""
        partition = shared.part[1]
        if isinstance(reply, Exception):
            for w, _ in shared.shares:
                _failed(w, partition, reply, errors)
            return
        if shared.part[0] == OUTCOMES:
            outcomes = self._group_errors(reply)
            for (w, _), error in zip(shared.shares, outcomes, strict=True):
                if error is None:
                    w.written.add(shared.part)
                else:
                    _failed(w, partition, error, errors)
            return
        for w, _ in shared.shares:
            w.written.add(shared.part)
        if shared.part[0] == FLIGHTS:
            paused_by_write(paused_of([reply]), shared.shares)

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
        (released ids, whether the consumer left the group: not while its claimer's poison
        ends wait, which the pruner takes over only from a consumer still in the group)."""
        keys = [self.keys.queue(task_type), self.keys.poison_ends(task_type, consumer)]
        ((released, removed),) = await self._run([(lua.RELEASE, keys, [GROUP, consumer, idle_ms])])
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
        self, task_type: str, consumer: str, count: int, min_idle_ms: int = 0,
        max_deliveries: int | None = None,
    ) -> list[Reclaimed]:  # fmt: skip
        """``recover.lua``: claim back what is pending under ``consumer`` with at least
        ``min_idle_ms`` of idle time (idle reset), each with its deliveries. With
        ``max_deliveries`` (a consumer's start) one delivered that many times already is
        left to the claimer as poison, one delivered ``max_deliveries`` - 2 times or more
        is a suspect to run alone (``Reclaimed.alone``: counted by ``count_delivery`` as
        it starts), and each other counts as delivered once more; without, counts are
        kept."""
        args = [
            GROUP,
            consumer,
            count,
            min_idle_ms,
            "" if max_deliveries is None else max_deliveries,
        ]
        (entries,) = await self._run([(lua.RECOVER, [self.keys.queue(task_type)], args)])
        return [
            Reclaimed(msg_id.decode(), consumer, 0, int(count), flat_fields(fields), alone == 1)
            for msg_id, fields, count, alone in entries
        ]

    async def count_delivery(
        self, task_type: str, consumer: str, msg_id: str, deliveries: int
    ) -> int:
        """``count_delivery.lua``: one delivery more for a suspect about to run alone, from
        the ``deliveries`` ``recover`` gave it (repeated, it counts once); its deliveries
        now, or 0 when it is no longer pending under ``consumer``."""
        args = [GROUP, consumer, msg_id, deliveries]
        (count,) = await self._run([(lua.COUNT_DELIVERY, [self.keys.queue(task_type)], args)])
        return int(count)

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
        keys = [k.queue(task_type), k.dlq(task_type), k.poison_ends(task_type, consumer)]
        ((claimed, poisoned, stalled, now_ms, ended, held),) = await self._run(
            [(lua.RECLAIM, keys, args)]
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
            held=held.decode() if isinstance(held, bytes) else str(held or ""),
        )  # fmt: skip

    async def poison_ends(
        self, task_type: str, consumer: str
    ) -> dict[int | None, tuple[list[bytes], list[FlightEnd], list[OutcomeWrite]]]:
        """The poison ends ``reclaim.lua`` left for ``consumer``'s claimer, by the partition
        of their task (each partition's written apart): (their ids, the flights to end, the
        outcomes to record); None: entries not written by it, nothing to do but drop them.
        Done, they are dropped with ``forget_poison_ends``; read again until then."""
        raw = await self.client.execute("HGETALL", self.keys.poison_ends(task_type, consumer))
        flat: dict[int | None, list[Any]] = {}
        out: dict[int | None, tuple[list[bytes], list[FlightEnd], list[OutcomeWrite]]] = {}
        for msg_id, item in raw.items():
            try:
                now_ms, task_id, due, code, attempt = unpackb(item, raw=True)
                due_ms, tries, at = int(due), int(attempt), int(now_ms)
                task, origin = task_id.decode(), origin_of(code.decode())
                partition: int | None = self.keys.partition_of(task)
            except (ValueError, TypeError, AttributeError, OverflowError):
                partition = None  # not written by reclaim.lua: only to drop
            ids, _, dead = out.setdefault(partition, ([], [], []))
            ids.append(msg_id)
            if partition is None:
                continue
            flat.setdefault(partition, []).extend([task_id, due, code, attempt])
            dead.append(
                OutcomeWrite(task, 2, at, POISON_LINE, due_ms, attempt=tries,
                             origin=origin, line=POISON_LINE)
            )  # fmt: skip
        for partition, values in flat.items():
            out[partition][1].extend(ended_flights(values, ENDED_DEAD, 4))
        return out

    async def poison_ends_ended(
        self, task_type: str, consumer: str, done: list[bytes], dead: list[OutcomeWrite]
    ) -> None:
        """Keep these poison ends (``poison_ends``: ids and their outcomes, in order) as
        having had their flights ended: their policy code cut to their origin, so that a
        round that writes them again records them without ending their flights twice."""
        values: list[Any] = []
        for msg_id, o in zip(done, dead, strict=True):
            letter = LETTER_OF_ORIGIN.get(o.origin)
            code = with_origin("", letter) if letter else ""
            values += [msg_id, packb([str(o.finished_ms), o.task_id, str(o.due_ms), code,
                                      str(o.attempt)])]  # fmt: skip
        if values:
            await self.client.execute("HSET", self.keys.poison_ends(task_type, consumer), *values)

    async def forget_poison_ends(self, task_type: str, consumer: str, done: list[bytes]) -> None:
        """Drop these poison ends (``poison_ends``), once they are done."""
        if done:
            await self.client.execute("HDEL", self.keys.poison_ends(task_type, consumer), *done)

    async def prune_consumers(self, task_type: str, min_idle_ms: int, keep: str) -> list[str]:
        """``prune_consumers.lua``: remove consumers idle that long with nothing pending
        and their names held by no live consumer (never ``keep``, the caller's consumer,
        which takes over the poison ends the removed ones' claimers left undone); their
        names."""
        k = self.keys
        keys = [k.queue(task_type), k.poison_ends(task_type, keep)]
        args = [GROUP, min_idle_ms, keep, k.poison_ends(task_type, ""), k.owner(task_type, "")]
        (removed,) = await self._run([(lua.PRUNE_CONSUMERS, keys, args)])
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


def _failed(
    write: CompletionWrite, partition: int, error: Exception, errors: dict[int, Exception]
) -> None:
    """``write``'s part in ``partition`` failed with ``error``: its first error, and the
    partition among its ``rejected`` ones when Redis rejected it (``rejected_alone``)."""
    errors.setdefault(id(write), error)
    if rejected_alone(error):
        write.rejected.setdefault(partition, error)
