"""The execution roles' scripts for the fires they run: the consumer's begin and complete
(ACK, retries, outcomes, dead letters in one pipeline). Leases, names, recovery, reclaim,
prune and trim: ``actors.store.upkeep_scripts``. A part of ``actors.store.scripts.Scripts``;
nothing else uses it alone."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

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
    paused_of,
)
from actors.store.history import Ledger
from actors.store.keys import GROUP
from actors.store.labels import say_unreadable
from actors.store.messages import Message
from actors.store.records import pack_array
from actors.store.replies import (
    DeadLetterWrite,
    OutcomeWrite,
    RetryWrite,
)
from actors.store.task_scripts import Call
from actors.store.upkeep_scripts import UpkeepScripts
from runtime.redis_io import Reply
from runtime.redis_replies import classify, rejected_alone


class ExecutionScripts(UpkeepScripts):
    """The consumer's scripts for the fires it runs (begin, complete), as typed async
    methods; its and the claimer's upkeep: ``UpkeepScripts``."""

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
                m.attempt + 1, m.due_ms, r.error, m.policy, m.msg_id,
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
            for group, error in zip(reply, self._group_errors(reply), strict=True):
                if error is not None:
                    raise error
                total += _updated(group)
        return total

    def _group_errors(self, reply: Any) -> list[Exception | None]:
        """``record_outcomes.lua``'s reply: each group's error (None: written in full; a
        group's count is an integer, or a list of it and the tasks whose counts could
        not be decoded, each said here; its error a string)."""
        return [
            None
            if isinstance(group, (int, list))
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
            for group in reply:
                if isinstance(group, list):  # names tasks whose counts were not written
                    _updated(group)
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


def _updated(group: int | list[Any]) -> int:
    """A ``record_outcomes.lua`` group's count of tasks updated; a ``task_unreadable``
    line for each task it names whose run record could not be decoded (its outcome went
    to its history and attention, not to its counts)."""
    if isinstance(group, int):
        return group
    say_unreadable([(_text(t), RUN_UNREADABLE) for t in group[1:]])
    return int(group[0])


def _text(value: bytes | str) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


#: What a ``task_unreadable`` line says of a task whose run record cannot be decoded.
RUN_UNREADABLE = (
    "its run record (runs, retries, last status) cannot be decoded: an outcome of it went "
    "to its history, not its counts; delete and create the task again to mend it"
)


def _failed(
    write: CompletionWrite, partition: int, error: Exception, errors: dict[int, Exception]
) -> None:
    """``write``'s part in ``partition`` failed with ``error``: its first error, and the
    partition among its ``rejected`` ones when Redis rejected it (``rejected_alone``)."""
    errors.setdefault(id(write), error)
    if rejected_alone(error):
        write.rejected.setdefault(partition, error)
