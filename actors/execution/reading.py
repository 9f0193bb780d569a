"""A consumer's reading part: new messages from its type's stream, and messages the
claimer took over for it (its mailbox); each is checked against the dedupe window, then
started.

Per read it asks XREADGROUP for only as many messages as it has free handler slots beyond
those the mailbox's messages will take (backpressure: it never hoards messages other
nodes could run). A read in progress is not abandoned on a stop request (what it returns
would sit in our PEL unseen): its messages are kept in flight unstarted, and released at
the end.

A read whose reply was lost may have delivered messages no one here has seen: pending
under our name, never renewed. They are taken back after a read that failed, and, since
a client can retry a read internally (redis-py's cluster client does) so that no error
ever reaches us, every lease from the reading loop itself: whatever is pending under our
name, idle past half a lease, and neither in flight nor in the mailbox.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import trio
import trio_util

from actors.execution.alone import Alone
from actors.execution.completion import Outcome, fire_fields
from actors.execution.flight import Flight
from actors.store.flights import origin_of, parse_policy
from actors.store.messages import MalformedMessage, Message
from actors.store.replies import DeadLetterWrite, Reclaimed, folded
from actors.store.scripts import Scripts
from actors.store.streams import Streams
from runtime.channels import Mailbox
from runtime.errors import RedisRefused, RedisUnavailable
from runtime.logging import debug_enabled, emit_events, get_logger, notify_observers
from runtime.redis_io import ResponseError
from runtime.redis_replies import refused, rejected_alone, reply_text, restarts

if TYPE_CHECKING:
    from actors.execution.consumer import ConsumerState

#: Most pending messages taken back at once: after a read whose reply was lost, and by the
#: sweep every lease of what is pending under our name and was never seen.
RECOVER_UNSEEN = 10_000


class Reader:
    def __init__(
        self,
        scripts: Scripts,
        streams: Streams,
        task_type: str,
        node: str,
        flight: Flight,
        state: ConsumerState,
        start: Callable[[list[Message]], None],
        *,
        block_ms: int,
        dedupe_window_ms: int,
        actor: str,
        lease_ms: int = 30_000,
        alone: Alone | None = None,
    ) -> None:
        self.scripts, self.streams = scripts, streams
        self.alone = alone or Alone()
        """The process's turn for its suspects (``run_alone``)."""
        self.type, self.node, self.actor = task_type, node, actor
        self.flight = flight
        self.free = state.free
        self.held = state.held
        self.pending_lock = state.pending_lock
        self._start = start
        self.block_ms, self.dedupe_window_ms = block_ms, dedupe_window_ms
        self._malformed_held_said = False
        """Whether ``malformed_held`` was said for the rejection going on."""
        self.lease_ms = lease_ms
        self._refusals = 0
        """Reads refused in a row (a refusal run the client counts as one waiting step)."""
        self._unavailable = 0
        """Reads that failed as unavailable in a row (``wait_unavailable``)."""
        self.suspects_done = trio.Event()
        """Set once the suspects have run (``run_alone``): nothing else starts before."""
        self.suspects_done.set()

    async def read_stream(self, consumer: str, stopping: trio_util.AsyncBool) -> None:
        """Read while not stopping."""
        try:
            await self._read_stream(consumer, stopping)
        finally:
            if self._refusals:
                self._refusals = 0
                self.scripts.client.refusal_ended(accepted=False)

    async def _read_stream(self, consumer: str, stopping: trio_util.AsyncBool) -> None:
        await self._after_suspects(stopping)
        next_sweep = trio.current_time() + self.lease_ms / 1000
        while not stopping.value:
            if trio.current_time() >= next_sweep:
                next_sweep = trio.current_time() + self.lease_ms / 1000
                swept = await self._recover_unseen(consumer, self.lease_ms // 2)
                await self._take(*swept, stopping)
            if self.free.value <= len(self.held):  # (usually a slot is free, none held)
                # The mailbox's messages first (the claimer's, taken over from a dead
                # consumer: older than any read now), then a read for what slots are left.
                # Looked at again at least every block_ms: the mailbox may drop one
                # without starting it (expired, a duplicate), which frees no slot.
                async with trio_util.move_on_when(stopping.wait_value, True):
                    with trio.move_on_after(self.block_ms / 1000):
                        await self.free.wait_value(lambda free: free > len(self.held))
                # Looked at again before the read: woken with the others that wait for a
                # slot (the mailbox's, the recovered messages'), one of them may have taken
                # it meanwhile, and a read of no count would take the whole backlog.
                continue
            if self.alone.closed:  # nothing read that could not start (see Alone)
                async with trio_util.move_on_when(stopping.wait_value, True):
                    await self.alone.wait_to_start()
                continue
            try:
                messages, malformed = await self.streams.read_group(
                    self.type, consumer, self.free.value - len(self.held), self.block_ms
                )
            except (RedisRefused, ResponseError) as exc:
                # Refused (NOREPLICAS, a permission) or rejected (the stream's key holds
                # another kind of value: WRONGTYPE): PING answers at once, so wait as
                # ride_out does for a refusal (backoff, one line a run), not for an outage.
                # A stream or group gone (NOGROUP) fails the read: the actor creates it again.
                if isinstance(exc, ResponseError):
                    if restarts(exc):
                        raise
                    exc = refused(exc, self.scripts.client.description)
                self._refusals += 1
                await self.scripts.client.wait_refused(exc, self._refusals, self.actor)
                messages, malformed = await self._recover_unseen(consumer, 0)
            except RedisUnavailable:
                self._unavailable += 1
                await self.scripts.client.wait_unavailable(self._unavailable)
                messages, malformed = await self._recover_unseen(consumer, 0)
            else:
                self._unavailable = 0
                if self._refusals:
                    self._refusals = 0
                    self.scripts.client.refusal_ended(accepted=True)
            await self._take(messages, malformed, stopping)

    async def _recover_unseen(
        self, consumer: str, min_idle_ms: int
    ) -> tuple[list[Message], list[tuple[str, dict[bytes, bytes], str]]]:
        """``_unseen``, under the consumer's pending lock (``ConsumerState.pending_lock``):
        no batch settles and no hand-over lands while its reply is on the way, so what it
        returns is neither finished nor in the mailbox; in flight before the lock goes."""
        async with self.pending_lock:
            messages, malformed = await self.scripts.client.ride_out(
                lambda: self._unseen(consumer, min_idle_ms), self.actor
            )
            for message in messages:
                self.flight.messages[message.msg_id] = message
        return messages, malformed

    async def _take(
        self,
        messages: list[Message],
        malformed: list[tuple[str, dict[bytes, bytes], str]],
        stopping: trio_util.AsyncBool,
    ) -> None:
        """Read messages: in flight (renewed, released at the end), then started. Each
        one's first delivery (read now, or by a read whose reply was lost: never seen
        anywhere), so a catch-up window judges it."""
        for message in messages:
            self.flight.messages[message.msg_id] = message
        if malformed:
            await self._dead_letter_malformed(malformed)
        if messages and not stopping.value:
            await self.begin(messages, first=True)

    async def read_recovered(self, entries: list[Reclaimed], stopping: trio_util.AsyncBool) -> None:
        """What an earlier incarnation of our name left pending (``recover.lua``): already
        ours again, each run as a slot frees up once the suspects have run."""
        messages, malformed = _decoded(entries, self.type)
        # In flight at once (before any await: a recovery of the name's entries leaves
        # them alone), though they start only as slots free up: their leases are renewed
        # meanwhile, so no other node's claimer takes one that will still run here.
        for message in messages:
            self.flight.messages[message.msg_id] = message
        if malformed:
            await self._dead_letter_malformed(malformed)
        emit_events(self.actor, [("recovered", fire_fields(m)) for m in messages])
        async with trio_util.move_on_when(stopping.wait_value, True):
            await self.suspects_done.wait()
            for message in messages:
                await self.free.wait_value(lambda free: free > 0)
                await self.begin([message])

    def expect_suspects(self) -> None:
        """Hold every other start until ``run_alone`` is done with the suspects."""
        self.suspects_done = trio.Event()

    async def run_alone(
        self, entries: list[Reclaimed], consumer: str, stopping: trio_util.AsyncBool
    ) -> None:
        """Suspects (``recover.lua``: delivered ``max_deliveries`` - 2 times or more, so
        one more death shared with a poison message would leave them a delivery short of
        poison), one at a time and before anything else of this type, fewest deliveries
        first: each counted as delivered once more as it starts (``count_delivery.lua``)
        and settled (acknowledged, retried or dead-lettered) before the next starts, each
        in the process's turn (``actors.execution.alone``: no other handler of the
        process runs meanwhile). A death while one runs counts against that one alone of
        the messages running, so a message that kills its process reaches
        ``max_deliveries`` by itself and the messages read beside it run. A stop leaves
        the rest to be released."""
        try:
            ordered = sorted(entries, key=lambda e: (e.deliveries, e.msg_id))
            messages, malformed = _decoded(ordered, self.type)
            for message in messages:  # in flight at once: renewed while they wait
                self.flight.messages[message.msg_id] = message
            if malformed:
                await self._dead_letter_malformed(malformed)
            emit_events(self.actor, [("recovered", fire_fields(m, alone=True)) for m in messages])
            deliveries = {e.msg_id: e.deliveries for e in entries}
            async with trio_util.move_on_when(stopping.wait_value, True):
                for message in messages:
                    async with self.alone.turn():
                        await self._run_one_alone(message, consumer, deliveries[message.msg_id])
        finally:
            self.suspects_done.set()

    async def _run_one_alone(self, message: Message, consumer: str, deliveries: int) -> None:
        count = await self.scripts.client.ride_out(
            functools.partial(
                self.scripts.count_delivery, self.type, consumer, message.msg_id, deliveries
            ),
            self.actor,
        )
        if not count:  # no longer ours: not to run here
            self.flight.messages.pop(message.msg_id, None)
            return
        await self.begin([message], alone=True)
        await self.flight.until_settled(message.msg_id)

    async def _after_suspects(self, stopping: trio_util.AsyncBool) -> None:
        async with trio_util.move_on_when(stopping.wait_value, True):
            await self.suspects_done.wait()

    async def _unseen(
        self, consumer: str, min_idle_ms: int = 0
    ) -> tuple[list[Message], list[tuple[str, dict[bytes, bytes], str]]]:
        """A read whose reply was lost (Redis went away mid-call) may have delivered
        messages: pending under our name, never seen here. A new read with ``>`` would not
        return them; take them back now (idle reset, so no claimer takes them too) rather
        than a lease later. Those already in flight are left to their handlers, and those
        waiting in the mailbox to the mailbox (each starts once). Called from the reading
        loop only, so no read of ours is under way meanwhile."""
        entries = await self.scripts.recover(self.type, consumer, RECOVER_UNSEEN, min_idle_ms)
        unseen = [
            e for e in entries if e.msg_id not in self.flight.messages and e.msg_id not in self.held
        ]
        messages, malformed = _decoded(unseen, self.type)
        if messages:
            emit_events(self.actor, [("recovered", fire_fields(m)) for m in messages])
        return messages, malformed

    async def read_inbox(self, inbox: Mailbox[Message], stopping: trio_util.AsyncBool) -> None:
        """Messages the claimer took over for us: already pending under our name."""
        async with trio_util.move_on_when(stopping.wait_value, True):
            await self.suspects_done.wait()
            async for message in inbox.receive:
                await self.free.wait_value(lambda free: free > 0)
                if self.held.pop(message.msg_id, None) is None or (
                    message.msg_id in self.flight.messages
                ):
                    continue  # recovered, released or running already: not to start here
                self.flight.messages[message.msg_id] = message
                await self.begin([message])

    async def begin(
        self, messages: list[Message], *, alone: bool = False, first: bool = False
    ) -> None:
        """Drop duplicates (dedupe window), then start the rest (``HandlerPool.submit``),
        once no suspect of the process has the turn (unless ``alone``: the suspect's):
        waited for before the checks and the start lag, and again right before the start.
        ``first``: the messages' first delivery, which a catch-up window judges
        (``_unexpired``); taken over from another consumer, or left by an earlier
        incarnation of ours, a fire may have started there on time: it runs again, never
        not at all."""
        if not alone and self.alone.closed:
            await self.alone.wait_to_start()
        runnable = messages
        if self.dedupe_window_ms > 0:
            flags = await self.scripts.client.ride_out(
                lambda: self.scripts.begin_runs(self.type, messages, self.dedupe_window_ms)
            )
            runnable = [m for m, run in zip(messages, flags, strict=True) if run]
            duplicates = [m for m, run in zip(messages, flags, strict=True) if not run]
            if duplicates:
                ids = [m.msg_id for m in duplicates]
                await self.scripts.client.ride_out(lambda: self.scripts.ack(self.type, ids))
                for m in duplicates:  # acknowledged: no longer ours to renew or release
                    self.flight.messages.pop(m.msg_id, None)
                emit_events(self.actor, [("duplicate_dropped", fire_fields(m)) for m in duplicates])
        if first and any(m.policy for m in runnable):
            runnable = await self._unexpired(runnable)
        now_ms = int(time.time() * 1000)
        # A debug line (the fire's info line, written when it ends, has its start time);
        # when it is not written, observers (metrics: starts, start lag) get the batch's
        # starts in one event instead of a line's fields built for every fire.
        if debug_enabled():
            emit_events(
                self.actor,
                [("running", fire_fields(m, start_lag_ms=now_ms - lag_from(m))) for m in runnable],
                level="debug",
            )
        elif runnable:
            lags = [now_ms - lag_from(m) for m in runnable]
            notify_observers(
                self.actor, [("runs_started", {"type": self.type, "start_lags_ms": lags})]
            )
        if not alone and self.alone.closed:  # no wait from here to the start
            await self.alone.wait_to_start()
        self._start(runnable)

    async def _unexpired(self, messages: list[Message]) -> list[Message]:
        """The messages to start: a first attempt later than its task's catch-up window
        (on Redis's clock, carried forward) is not run; its outcome says ``expired``."""
        windowed = [(m, parse_policy(m.policy)) for m in messages if m.policy and m.attempt == 0]
        if not any(p.window_ms is not None for _, p in windowed):
            return messages
        redis_ms = await self.scripts.client.ride_out(lambda: self.scripts.client.clock_ms())
        expired = {m.msg_id for m, policy in windowed if policy.expired(m.due_ms, redis_ms)}
        for m in messages:
            if m.msg_id in expired:
                self.flight.finish(Outcome(m, redis_ms, redis_ms, not_run="expired"))
        return [m for m in messages if m.msg_id not in expired]

    async def _dead_letter_malformed(
        self, malformed: list[tuple[str, dict[bytes, bytes], str]]
    ) -> None:
        entries = [
            DeadLetterWrite(
                msg_id,
                {
                    **folded(fields),
                    "reason": "malformed", "error": error, "node": self.node, "msg_id": msg_id,
                },
            )
            for msg_id, fields, error in malformed
        ]  # fmt: skip
        if not await self.scripts.client.ride_out(lambda: self._dead_letter_or_leave(entries)):
            return
        events: list[tuple[str, dict[str, Any]]] = [
            ("dead", {"msg_id": m, "type": self.type, "reason": "malformed", "error": e})
            for m, _, e in malformed
        ]
        emit_events(self.actor, events)

    async def _dead_letter_or_leave(self, entries: list[DeadLetterWrite]) -> bool:
        """Dead-letter ``entries``; False when Redis rejects the dead-letter stream (a
        key of another kind): they are left pending, said in a ``malformed_held`` line,
        and reading goes on (waited on, that key would stop the type's reads). Taken back
        by this consumer's sweep each lease, it is dead-lettered once the key is mended (or,
        taken over by another node's claimer and delivered ``max_deliveries`` times, as
        poison: the claimer holds it while the key stays broken). Said once while the
        rejection lasts."""
        try:
            await self.scripts.dead_letter(self.type, entries)
        except ResponseError as exc:
            if not rejected_alone(exc):
                raise
            if not self._malformed_held_said:  # taken back and tried each lease: said once
                get_logger(actor=self.actor).warning(
                    "malformed_held", type=self.type, error=reply_text(exc),
                    msg_ids=[e.msg_id for e in entries],
                )  # fmt: skip
            self._malformed_held_said = True
            return False
        self._malformed_held_said = False
        return True


def _decoded(
    entries: list[Reclaimed], task_type: str
) -> tuple[list[Message], list[tuple[str, dict[bytes, bytes], str]]]:
    """The entries' messages, and the malformed ones with their errors."""
    messages, malformed = [], []
    for entry in entries:
        try:
            messages.append(Message.decode(entry.msg_id, entry.fields, task_type))
        except MalformedMessage as exc:
            malformed.append((entry.msg_id, entry.fields, str(exc)))
    return messages, malformed


def lag_from(m: Message) -> int:
    """What a start's lag counts from: a scheduled fire's first attempt, its due time;
    anything else, when it was appended (a retry's backoff, a backfill's past grid time,
    a replay's wait in the dead letters are no lateness of the consumers)."""
    if m.attempt or (m.policy and origin_of(m.policy)):
        return m.enq_ms
    return m.due_ms
