"""The consumer group actor of one task type: reads its stream, runs the handler, acks.

Per read it asks XREADGROUP for only as many messages as it has free handler slots
(backpressure: it never hoards messages other nodes could run). Each message:

1. ``begin_runs.lua`` marks the fire started; a second message of the same fire within the
   dedupe window is dropped (``duplicate_dropped``), a reclaimed message still runs;
2. the handler runs under its timeout (``running`` ... ``finished`` / failure);
3. completions are flushed in batches: results-log lines written; failed fires saved as
   retries (``schedule_retries.lua``) or dead-lettered (``dead_letter.lua``, which acks);
   then the rest acked (``ack.lua``) and the tasks' hashes updated.

Invariant: a message is acknowledged only after its handler finished and its outcome
(result line, retry context or DLQ entry) is written. A node killed at any point leaves
unacknowledged messages pending; the claimer of some node takes them over after the lease.

While handlers run, a separate task renews the lease of every in-flight message
(``renew_leases.lua``) every ``lease_s / 3``, so a live, busy consumer is never robbed.

Graceful stop (``graceful=True``): stop reading, let running handlers finish within the
grace, flush, then hand back anything unfinished with an idle time past any lease so other
nodes reclaim it at once (``release.lua``), and leave the group if nothing is pending here.
"""

from __future__ import annotations

import functools
import random
import secrets
import time
import traceback
from collections import defaultdict
from typing import Any

import attrs
import trio
import trio_util

from actors.config import ConsumerSection
from actors.execution.handlers import Handler, HandlerContext, RetryLater, Unrecoverable
from actors.execution.results_log import ResultsLog
from actors.store import scripts
from actors.store.keys import GROUP, Keys
from actors.store.messages import MalformedMessage, Message
from actors.store.records import OUTCOME_NAMES
from actors.store.tasks import TaskStore
from runtime.actor import ActorContext, TaskStatus
from runtime.channels import Mailbox
from runtime.logging import emit_events
from runtime.redis_io import ResponseError, Script

#: Idle time given to released messages: past any lease, so any claimer takes them now.
RELEASED_IDLE_MS = 10 * 365 * 24 * 3600 * 1000
#: How long the flusher waits after the first completion for others to join its batch.
FLUSH_GATHER_S = 0.005
#: Longest error text kept (DLQ entry, retry context, the task's last error).
MAX_ERROR_CHARS = 2000


@attrs.define
class ConsumerState:
    """What the claimer of a type needs from its consumer. Owned by the consumer."""

    name: str | None = None
    """This node's consumer name in the group, once the consumer is running."""
    free: trio_util.AsyncValue[int] = attrs.field(factory=lambda: trio_util.AsyncValue(0))
    """Free handler slots right now."""


@attrs.frozen
class Outcome:
    message: Message
    started_ms: int
    finished_ms: int
    result: Any = None
    error: str | None = None
    """None on success."""
    retry_after_s: float | None = None
    """Set by RetryLater."""
    unrecoverable: bool = False


def backoff_s(section: ConsumerSection, failed_attempt: int) -> float:
    """Delay before retry n (n = the 1-based number of the attempt that failed)."""
    base = min(section.backoff_cap_s, section.backoff_base_s * 2.0 ** min(failed_attempt - 1, 60))
    return base * (1 + random.uniform(0, section.backoff_jitter))


def describe_error(exc: BaseException) -> str:
    """The exception and a short traceback (the last frames), bounded in size."""
    lines = traceback.format_exception(exc, limit=-3)
    return "".join(lines)[-MAX_ERROR_CHARS:]


class Consumer:
    def __init__(
        self,
        store: TaskStore,
        task_type: str,
        section: ConsumerSection,
        handler: Handler,
        results: ResultsLog,
        node: str,
        inbox: Mailbox[Message],
        state: ConsumerState,
    ) -> None:
        self.store = store
        self.type = task_type
        self.section = section
        self.handler = handler
        self.results = results
        self.node = node
        self.inbox = inbox
        self.state = state
        self.actor = f"node/consumers/{task_type}/consumer"
        # Owned by one run of the actor (reset at start):
        self._in_flight: dict[str, Message] = {}
        """Messages read and not yet acknowledged, by id (running or awaiting the flush)."""
        self._done: list[Outcome] = []
        self._done_event = trio.Event()
        self._running = 0
        self._thread_limiter = trio.CapacityLimiter(section.concurrency)

    # -- the actor --------------------------------------------------------------------------

    async def run(self, ctx: ActorContext, *, task_status: TaskStatus) -> None:
        keys = await self.store.keys()
        self.actor = ctx.path
        await self._ensure_group(keys)
        name = f"{self.node}-{secrets.token_hex(4)}"
        self._in_flight, self._done, self._running = {}, [], 0
        self.state.name = name
        self.state.free.value = self.section.concurrency
        self.results.prepare()
        ctx.log.info("consumer_ready", consumer=name, stream=keys.queue(self.type))
        task_status.started()
        # Wind down on our stop request, or as soon as the whole node stops: supervisors
        # stop their children one at a time, and every type should stop reading at once.
        stopping = trio_util.AsyncBool(False)
        try:
            async with trio.open_nursery() as handlers, trio.open_nursery() as helpers:
                helpers.start_soon(self._renew_leases, keys, name)
                helpers.start_soon(self._flush_loop, keys)
                helpers.start_soon(self._watch_stop, ctx, stopping)
                async with trio.open_nursery() as readers:
                    readers.start_soon(self._read_stream, keys, name, handlers, stopping)
                    readers.start_soon(self._read_inbox, keys, handlers, stopping)
                # Stopping: no more reads. Running handlers finish (the supervisor
                # cancels us when the grace is over); then the last flush.
                await self.state.free.wait_value(lambda free: free >= self.section.concurrency)
                helpers.cancel_scope.cancel()
        finally:
            self.state.name = None
            with ctx.cleanup():
                await self._flush(keys)
                await self._release(keys, name, ctx)
            self.state.free.value = 0
        # Drained because the node is stopping: wait for our turn (returning now would
        # read as an exit to restart).
        await ctx.wait_stop_requested()

    @staticmethod
    async def _watch_stop(ctx: ActorContext, stopping: trio_util.AsyncBool) -> None:
        await trio_util.wait_any(
            ctx.wait_stop_requested, functools.partial(ctx.node_stopping.wait_value, True)
        )
        stopping.value = True

    async def _ensure_group(self, keys: Keys) -> None:
        try:
            await self.store.client.execute(
                "XGROUP", "CREATE", keys.queue(self.type), GROUP, "0", "MKSTREAM"
            )
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    # -- reading ----------------------------------------------------------------------------

    async def _read_stream(
        self, keys: Keys, name: str, handlers: trio.Nursery, stopping: trio_util.AsyncBool
    ) -> None:
        """Read while not stopping. A read in progress is not abandoned on a stop request
        (what it returns would sit in our PEL unseen): its messages are kept unstarted and
        released at the end."""
        stream = keys.queue(self.type)
        while not stopping.value:
            async with trio_util.move_on_when(stopping.wait_value, True):
                await self.state.free.wait_value(lambda free: free > 0)
            if stopping.value:
                return
            reply = await self.store.client.execute(
                "XREADGROUP", "GROUP", GROUP, name, "COUNT", self.state.free.value,
                "BLOCK", self.section.block_ms, "STREAMS", stream, ">",
            )  # fmt: skip
            if not reply:
                continue
            entries = reply[0][1] if isinstance(reply, list) else reply[stream.encode()][0]
            await self._start(keys, entries, handlers, start=not stopping.value)

    async def _read_inbox(
        self, keys: Keys, handlers: trio.Nursery, stopping: trio_util.AsyncBool
    ) -> None:
        """Messages the claimer took over for us: already pending under our name."""
        async with trio_util.move_on_when(stopping.wait_value, True):
            async for message in self.inbox.receive:
                await self.state.free.wait_value(lambda free: free > 0)
                self._in_flight[message.msg_id] = message
                await self._begin(keys, [message], handlers)

    async def _start(
        self, keys: Keys, entries: list[Any], handlers: trio.Nursery, *, start: bool = True
    ) -> None:
        """Decode and (unless ``start`` is false: stopping) run what a read returned."""
        messages: list[Message] = []
        malformed: list[tuple[str, dict[bytes, bytes], str]] = []
        for msg_id, fields in entries:
            if fields is None:
                continue  # deleted while pending: nothing to run
            try:
                message = Message.decode(msg_id, fields)
            except MalformedMessage as exc:
                malformed.append((msg_id.decode(), fields, str(exc)))
                continue
            messages.append(message)
            self._in_flight[message.msg_id] = message
        if malformed:
            await self._dead_letter_malformed(keys, malformed)
        if messages and start:
            await self._begin(keys, messages, handlers)

    async def _begin(self, keys: Keys, messages: list[Message], handlers: trio.Nursery) -> None:
        """Drop duplicates (dedupe window), then start a handler per message."""
        runnable = messages
        if self.section.dedupe_window_s > 0:
            args: list[Any] = [
                keys.seen_prefix(self.type),
                int(self.section.dedupe_window_s * 1000),
            ]
            for m in messages:
                args += [m.msg_id, m.fire_key]
            flags = await self.store.client.script(
                scripts.BEGIN_RUNS, [keys.queue(self.type)], args
            )
            runnable = [m for m, flag in zip(messages, flags, strict=True) if int(flag)]
            duplicates = [m for m, flag in zip(messages, flags, strict=True) if not int(flag)]
            if duplicates:
                await self._ack(keys, [m.msg_id for m in duplicates])
                emit_events(
                    self.actor, [("duplicate_dropped", _fire_fields(m)) for m in duplicates]
                )
        now_ms = int(time.time() * 1000)
        emit_events(
            self.actor,
            [("running", {**_fire_fields(m), "start_lag_ms": now_ms - m.due_ms}) for m in runnable],
        )
        for message in runnable:
            self._running += 1
            self.state.free.value -= 1
            handlers.start_soon(self._run_one, message)

    # -- running ----------------------------------------------------------------------------

    async def _run_one(self, message: Message) -> None:
        started_ms = int(time.time() * 1000)
        outcome: Outcome
        try:
            # A bare cancel scope, not trio.fail_after: the same semantics without a
            # generator-based context manager, which cost ~3 % of a busy consumer.
            with trio.CancelScope(deadline=trio.current_time() + self.section.timeout_s) as limit:
                result = await self._call_handler(message)
            if limit.cancelled_caught:
                error = f"timeout: handler ran longer than {self.section.timeout_s:g}s"
                outcome = Outcome(message, started_ms, int(time.time() * 1000), error=error)
            else:
                outcome = Outcome(message, started_ms, int(time.time() * 1000), result=result)
        except RetryLater as exc:
            outcome = Outcome(
                message, started_ms, int(time.time() * 1000),
                error=describe_error(exc), retry_after_s=exc.delay_s,
            )  # fmt: skip
        except Unrecoverable as exc:
            outcome = Outcome(
                message, started_ms, int(time.time() * 1000),
                error=describe_error(exc), unrecoverable=True,
            )  # fmt: skip
        except Exception as exc:
            outcome = Outcome(
                message, started_ms, int(time.time() * 1000), error=describe_error(exc)
            )
        finally:
            # Runs on cancellation too: the slot is free again; the message stays in flight
            # (unacknowledged) and is released at shutdown.
            self._running -= 1
            self.state.free.value += 1
        self._done.append(outcome)
        self._done_event.set()

    async def _call_handler(self, message: Message) -> Any:
        context = HandlerContext(
            task_id=message.task_id,
            schedule_id=message.schedule_id,
            type=message.type,
            payload=message.payload,
            attempt=message.attempt,
            due_ms=message.due_ms,
            actor=self.actor,
        )
        if self.handler.is_async:
            return await self.handler.fn(context)
        return await trio.to_thread.run_sync(
            self.handler.fn, context, abandon_on_cancel=True, limiter=self._thread_limiter
        )

    # -- completing -------------------------------------------------------------------------

    async def _flush_loop(self, keys: Keys) -> None:
        while True:
            await self._done_event.wait()
            # Handlers started together finish together: gather them into one batch.
            await trio.sleep(FLUSH_GATHER_S)
            self._done_event = trio.Event()
            await self._flush(keys)

    async def _flush(self, keys: Keys) -> None:
        """Write outcomes, then acknowledge (see the module's invariant).

        A batch, once taken, is completed under a shield: cancelled halfway, its finished
        messages would be released instead of acknowledged and run again elsewhere. Every
        step is a Redis call bounded by the socket timeout, so the shield cannot hang.
        """
        while self._done:
            batch, self._done = self._done, []
            with trio.CancelScope(shield=True):
                await self._complete(keys, batch)

    async def _complete(self, keys: Keys, batch: list[Outcome]) -> None:
        ok = [o for o in batch if o.error is None]
        failed = [o for o in batch if o.error is not None]
        retry = [
            o for o in failed
            if not o.unrecoverable and o.message.attempt + 1 < self.section.max_attempts
        ]  # fmt: skip
        dead = [o for o in failed if o not in retry]
        self.results.append([_result_record(o) for o in ok])
        delays = {o.message.msg_id: self._retry_delay(o) for o in retry}
        # A retry must be saved before its message is acknowledged. On one server a single
        # pipeline runs in order; across cluster shards it need not, so there the partition
        # writes (retries, outcomes) complete first and the stream writes follow.
        partition_calls = self._partition_calls(keys, retry, delays, ok, dead)
        stream_calls = self._stream_calls(keys, ok + retry, dead)
        if self.store.client.is_cluster:
            await self._run_calls(partition_calls)
            await self._run_calls(stream_calls)
        else:
            await self._run_calls(partition_calls + stream_calls)
        for o in batch:
            self._in_flight.pop(o.message.msg_id, None)
        emit_events(self.actor, self._outcome_events(ok, retry, dead, delays))

    async def _run_calls(self, calls: list[tuple[Script, list[Any], list[Any]]]) -> None:
        if calls:
            for reply in await self.store.client.mixed_scripts(calls):
                if isinstance(reply, Exception):
                    raise reply

    def _retry_delay(self, outcome: Outcome) -> float:
        if outcome.retry_after_s is not None:
            return max(0.0, outcome.retry_after_s)
        return backoff_s(self.section, outcome.message.attempt + 1)

    def _partition_calls(
        self,
        keys: Keys,
        retry: list[Outcome],
        delays: dict[str, float],
        ok: list[Outcome],
        dead: list[Outcome],
    ) -> list[tuple[Script, list[Any], list[Any]]]:
        """Retry contexts, and each task's last outcome, per partition."""
        retry_args: dict[int, list[Any]] = defaultdict(list)
        for o in retry:
            m = o.message
            retry_at = o.finished_ms + int(delays[m.msg_id] * 1000)
            retry_args[keys.partition_of(m.task_id)] += [
                m.schedule_id, retry_at, m.task_id, m.type, m.payload_json,
                m.attempt + 1, m.due_ms, o.error or "",
            ]  # fmt: skip
        outcome_args: dict[int, list[Any]] = defaultdict(list)
        for kind, outcomes in (("ok", ok), ("retry", retry), ("dead", dead)):
            for o in outcomes:
                task_id = o.message.task_id
                outcome_args[keys.partition_of(task_id)] += [
                    task_id, keys.bucket_of(task_id), OUTCOME_NAMES.index(kind), o.finished_ms,
                    (o.error or "")[:MAX_ERROR_CHARS],
                ]  # fmt: skip
        return [
            (scripts.SCHEDULE_RETRIES, [keys.retry(p)], [keys.retry_context_prefix(p), *args])
            for p, args in retry_args.items()
        ] + [
            (scripts.RECORD_OUTCOMES, [keys.schedule(p)], [keys.tag(p), *args])
            for p, args in outcome_args.items()
        ]

    def _stream_calls(
        self, keys: Keys, acked: list[Outcome], dead: list[Outcome]
    ) -> list[tuple[Script, list[Any], list[Any]]]:
        """Dead letters (acknowledged in the same script), then the rest acknowledged."""
        calls: list[tuple[Script, list[Any], list[Any]]] = []
        if dead:
            entries = []
            for o in dead:
                m = o.message
                entry = {
                    **m.fields(),
                    "attempts": str(m.attempt + 1),
                    "reason": "unrecoverable" if o.unrecoverable else "failed",
                    "error": o.error or "",
                    "node": self.node,
                    "dead_ms": str(o.finished_ms),
                    "msg_id": m.msg_id,
                }
                entries.append((m.msg_id, [x for kv in entry.items() for x in kv]))
            calls.append(self._dead_letter_call(keys, entries))
        if acked:
            calls.append(self._ack_call(keys, [o.message.msg_id for o in acked]))
        return calls

    def _dead_letter_call(
        self, keys: Keys, entries: list[tuple[str, list[Any]]]
    ) -> tuple[Script, list[Any], list[Any]]:
        """``dead_letter.lua`` for (message id, flat field/value list of its DLQ entry)."""
        args: list[Any] = [GROUP]
        for msg_id, fields in entries:
            args += [msg_id, len(fields), *fields]
        return (scripts.DEAD_LETTER, [keys.queue(self.type), keys.dlq(self.type)], args)

    def _ack_call(self, keys: Keys, ids: list[str]) -> tuple[Script, list[Any], list[Any]]:
        return (scripts.ACK, [keys.queue(self.type)], [GROUP, *ids])

    async def _dead_letter_malformed(
        self, keys: Keys, malformed: list[tuple[str, dict[bytes, bytes], str]]
    ) -> None:
        entries = [
            (msg_id, [*(x for kv in fields.items() for x in kv),
                      "reason", "malformed", "error", error, "node", self.node, "msg_id", msg_id])
            for msg_id, fields, error in malformed
        ]  # fmt: skip
        await self._run_calls([self._dead_letter_call(keys, entries)])
        emit_events(
            self.actor,
            [("dead", {"msg_id": m, "type": self.type, "reason": "malformed", "error": e})
             for m, _, e in malformed],
        )  # fmt: skip

    async def _ack(self, keys: Keys, ids: list[str]) -> None:
        if ids:
            await self._run_calls([self._ack_call(keys, ids)])

    def _outcome_events(
        self, ok: list[Outcome], retry: list[Outcome], dead: list[Outcome], delays: dict[str, float]
    ) -> list[tuple[str, dict[str, Any]]]:
        events: list[tuple[str, dict[str, Any]]] = []
        for o in ok:
            events.append(
                (
                    "finished",
                    {**_fire_fields(o.message), "duration_ms": o.finished_ms - o.started_ms},
                )
            )
        for o in retry:
            events.append((
                "retried",
                {**_fire_fields(o.message), "next_attempt": o.message.attempt + 1,
                 "delay_s": round(delays[o.message.msg_id], 3), "error": _first_line(o.error)},
            ))  # fmt: skip
        for o in dead:
            events.append((
                "dead",
                {**_fire_fields(o.message), "attempts": o.message.attempt + 1,
                 "reason": "unrecoverable" if o.unrecoverable else "failed",
                 "error": _first_line(o.error)},
            ))  # fmt: skip
        return events

    # -- leases and release -------------------------------------------------------------------

    async def _renew_leases(self, keys: Keys, name: str) -> None:
        period_s = self.section.lease_s / 3
        while True:
            await trio.sleep(period_s)
            ids = list(self._in_flight)
            if ids:
                await self.store.client.script(
                    scripts.RENEW_LEASES, [keys.queue(self.type)], [GROUP, name, *ids]
                )

    async def _release(self, keys: Keys, name: str, ctx: ActorContext) -> None:
        """Hand back everything still pending under our name (unfinished, unstarted, or
        read by an abandoned call), claimable at once elsewhere; leave the group if
        nothing is pending here."""
        released, removed = await self.store.client.script(
            scripts.RELEASE, [keys.queue(self.type)], [GROUP, name, RELEASED_IDLE_MS]
        )
        known = [self._in_flight[i.decode()] for i in released if i.decode() in self._in_flight]
        emit_events(self.actor, [("released", _fire_fields(m)) for m in known])
        ctx.log.info(
            "consumer_stopped", consumer=name, released=len(released), left_group=bool(removed)
        )


def _fire_fields(m: Message) -> dict[str, Any]:
    return {
        "task_id": m.task_id,
        "schedule_id": m.schedule_id,
        "type": m.type,
        "attempt": m.attempt,
        "msg_id": m.msg_id,
    }


def _first_line(error: str | None) -> str:
    if not error:
        return ""
    lines = [line for line in error.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


def _result_record(o: Outcome) -> dict[str, Any]:
    m = o.message
    return {
        "task_id": m.task_id,
        "schedule_id": m.schedule_id,
        "type": m.type,
        "attempt": m.attempt,
        "due_ms": m.due_ms,
        "started_ms": o.started_ms,
        "finished_ms": o.finished_ms,
        "result": o.result,
    }
