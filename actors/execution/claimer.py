"""The claimer of one task type: takes over messages whose consumer died.

Every ``claimer_interval_s`` it runs ``reclaim.lua`` for as many messages as its node's
consumer of the type has free slots (less what already waits in its mailbox), and for
one while it has none and nothing waits there (a consumer kept busy by a backlog still
takes a dead one's messages over, once idle two leases, and dead-letters poison):
messages pending longer than the lease (their consumer stopped renewing them: it died,
or released them at shutdown) are claimed for this node's consumer and handed to it
through its mailbox; a message already delivered ``max_deliveries`` times is poison and
goes to the dead-letter queue instead.

Live holders win after an outage. While Redis is away, stalled or refusing writes, no
consumer can renew, yet its messages' idle time keeps counting on Redis's clock. So a
claimer takes nothing for a full lease after an outage or a run of refusals it saw end
that lasted a third of a lease or more (``RedisClient.last_ended``: a shorter one after it
does not end the wait),
and a reclaim call that Redis ran more than a third of a lease after it was sent (a pause
or stall in between: the call carries the stream server's clock as the claimer last read
it from that server, carried forward on the local monotonic clock) takes nothing and
counts as such an outage: by then every live holder has renewed.

Every round it also trims the stream's acknowledged entries from its head
(``trim_acked.lua``: consumers acknowledge without deleting, which saves Redis an ``XDEL``
a fire). Every ``PRUNE_EVERY_S`` it also removes consumers that are gone (idle longer than
``CONSUMER_GONE_MS``) and hold nothing (``prune_consumers.lua``); a consumer with pending
messages is never removed.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable
from typing import Any

import attrs
import trio

from actors.execution.consumer import ConsumerState
from actors.store.history import DEFAULT_HISTORY, Ledger
from actors.store.keys import CONSUMER_GONE_MS
from actors.store.messages import MalformedMessage, Message
from actors.store.replies import Reclaim
from actors.store.scripts import Scripts
from actors.store.tasks import TaskStore
from runtime.actor import ActorContext, TaskStatus
from runtime.channels import Mailbox
from runtime.errors import RedisRefused
from runtime.logging import emit_events, get_logger
from runtime.redis_io import RedisClient, ResponseError
from runtime.redis_replies import rejected_alone, restarts

PRUNE_EVERY_S = 30.0


@attrs.frozen
class ClaimerSettings:
    """One type's claimer (built from ``[consumers.<type>]`` and ``[execution]``)."""

    interval_s: float = 1.0
    lease_s: float = 30.0
    """A message pending this long without renewal is taken over."""
    max_deliveries: int = 5
    """A message delivered this often is poison: to the DLQ instead."""
    history: int = DEFAULT_HISTORY
    """Occurrences kept per task: a poison message is its task's ``dead`` one."""


class Claimer:
    def __init__(
        self,
        store: TaskStore,
        task_type: str,
        state: ConsumerState,
        inbox: Mailbox[Message],
        node: str,
        settings: ClaimerSettings,
    ) -> None:
        self.store = store
        self.type = task_type
        self.state = state
        self.inbox = inbox
        self.node = node
        self.settings = settings
        self.actor = f"node/consumers/{task_type}/claimer"
        self._stalled_at = -1e18
        """Monotonic time of the last reclaim call that found Redis had stalled it."""
        self._unsent: list[Message] = []
        """Handed over (held for the consumer), not in its mailbox yet (``_send_unsent``)."""
        self._clock: tuple[float, int] | None = None
        """(local monotonic s, the stream server's ms) as the last reclaim read them."""
        self._poison_ends_said = False
        """Whether ``poison_ends_skipped`` was said for the rejection going on."""
        self._skipped: set[str] = set()
        """Kinds of refusal a housekeeping step was skipped for (logged once each)."""
        self._poison_held_said = False
        """Whether ``poison_held`` was said for the refusal going on."""

    async def run(self, ctx: ActorContext, *, task_status: TaskStatus) -> None:
        task_status.started()  # before waiting for Redis: the node starts its other roles
        redis = self.store.client
        await redis.ride_out(self.store.keys)
        scripts = await self.store.scripts()
        self.actor = ctx.path
        last_prune = trio.current_time()
        while True:
            await trio.sleep(self.settings.interval_s)
            await redis.ride_out(lambda: self.tick(scripts), self.actor)
            await redis.ride_out(lambda: self._housekeeping(ctx, scripts.trim_acked(self.type)))
            # Not while live holders may not have renewed (their names' owner keys too).
            if trio.current_time() - last_prune >= PRUNE_EVERY_S and not self._in_grace(redis):
                await redis.ride_out(lambda: self._housekeeping(ctx, self.prune(scripts)))
                last_prune = trio.current_time()

    async def _housekeeping(self, ctx: ActorContext, step: Awaitable[object]) -> None:
        """A trim or prune: refused (a permission, a key of another kind), it is skipped
        until the next round, with one line a kind of refusal, rather than holding up the
        reclaims behind it. An outage is still waited out (``ride_out``)."""
        try:
            await step
        except (RedisRefused, ResponseError) as exc:
            if restarts(exc):
                raise
            kind = exc.kind if isinstance(exc, RedisRefused) else "rejected"
            if kind not in self._skipped:
                self._skipped.add(kind)
                ctx.log.warning("housekeeping_skipped", kind=kind, error=str(exc))

    def _in_grace(self, client: RedisClient) -> bool:
        """Whether an outage (or a stall, or refusals) long enough to have kept the live
        holders from renewing ended less than a lease ago."""
        ended = self._stalled_at
        long_one = client.last_ended(self.settings.lease_s / 3)  # not only the last one:
        if long_one is not None:  # a blip right after a long outage must not end the wait
            ended = max(ended, long_one)
        return time.monotonic() - ended < self.settings.lease_s

    def _sent_ms(self) -> int | None:
        """The stream server's clock now, as last read from it (None: not read yet)."""
        if self._clock is None:
            return None
        at, redis_ms = self._clock
        return redis_ms + int((time.monotonic() - at) * 1000)

    async def tick(self, scripts: Scripts) -> int:
        """Reclaim up to the consumer's free slots, and one while it has none and nothing
        waits in its mailbox; return how many were handed over. A consumer kept busy by a
        backlog has no free slot at most ticks (its reader fills each at once): taking
        nothing then, no claimer would take a dead consumer's messages over, nor
        dead-letter poison (the same call), until the backlog drained, and the stream
        could not be trimmed past them. The one taken starts at the next free slot (the
        reader leaves a slot to the mailbox first); only a message idle two leases is
        taken so, one a consumer with free slots has left (it takes them after one), or
        one a stopping or failed consumer released (idle at once, for either)."""
        await self._end_poisoned(scripts, self.state.name)  # not behind a full mailbox
        await self._send_unsent()
        async with self.state.pending_lock:
            name = self.state.name
            free = self.state.free.value - len(self.state.held)
            busy = free <= 0 and not self.state.held
            if busy:
                free = 1
            if name is None or free <= 0 or self.state.stopping or self._in_grace(scripts.client):
                return 0
            s = self.settings
            lease_ms = int(s.lease_s * 1000)
            reclaim = await scripts.reclaim(
                self.type, name, lease_ms * 2 if busy else lease_ms, free, s.max_deliveries,
                self.node, sent_ms=self._sent_ms(), max_delay_ms=lease_ms // 3,
            )  # fmt: skip
            self._clock = (time.monotonic(), reclaim.now_ms)
            if reclaim.held and not self._poison_held_said:  # said once while it lasts
                get_logger(actor=self.actor).warning(
                    "poison_held", type=self.type, error=reclaim.held,
                    fix="its dead letter is refused; it stays pending, tried each round",
                )  # fmt: skip
            self._poison_held_said = bool(reclaim.held)
            if reclaim.stalled:
                self._stalled_at = time.monotonic()
                return 0
            messages = self._hand_over(reclaim, name)
            self._unsent += messages
        await self._send_unsent()
        await self._end_poisoned(scripts, name)
        return len(messages)

    async def _send_unsent(self) -> None:
        """Send the consumer what was handed over (``held``) and not sent yet: a tick cut
        off or failed after its hand-over sends it first thing next tick (a held message
        never sent would be renewed for ever and never run). A consumer restarted since
        skips what is no longer its own."""
        while self._unsent:
            await self.inbox.send.send(self._unsent[0])
            del self._unsent[0]

    async def _end_poisoned(self, scripts: Scripts, name: str | None) -> None:
        """End the flights of the poison dead-lettered under ``name`` and record it dead in
        its tasks' histories: what ``reclaim.lua`` left to do in Redis (``Keys.poison_ends``),
        read, done, then dropped: a reclaim's reply lost, or this claimer gone, leaves
        them to the next step. One cut off between doing them and dropping them does them
        again (its history may then hold that fire twice; its dead streak counts it once)."""
        if name is None:
            return
        rejected: list[str] = []
        try:
            poison_ends = await scripts.poison_ends(self.type, name)
        except ResponseError as exc:
            # The key holds another kind of value: reclaim.lua holds poison back while it
            # does (``poison_held``), so nothing waits in it; the reclaims go on.
            if not rejected_alone(exc):
                raise
            poison_ends, rejected = {}, [f"{exc}"]
        for partition, (done, ends, dead) in poison_ends.items():
            ended = False
            try:  # each partition's apart: one rejected holds back no other, nor repeats it
                if ends:
                    await scripts.end_flights(ends)
                    ended = True
                if dead:
                    await scripts.record_outcomes(dead, self.type, Ledger(self.settings.history))
            except ResponseError as exc:
                # Rejected (a partition's key of another kind): kept, tried again next
                # round, said once; the reclaims go on meanwhile. An outage or a refusal of
                # every write is waited out as any step's is.
                if not rejected_alone(exc):
                    raise
                rejected.append(f"partition {partition}: {exc}")
                if ended:  # kept as ended: the next round records them, ends nothing again
                    await scripts.poison_ends_ended(self.type, name, done, dead)
                continue
            await scripts.forget_poison_ends(self.type, name, done)
        if rejected and not self._poison_ends_said:
            emit_events(self.actor, [("poison_ends_skipped", {"type": self.type,
                                                              "error": rejected[0]})])  # fmt: skip
        self._poison_ends_said = bool(rejected)

    def _hand_over(self, reclaim: Reclaim, name: str) -> list[Message]:
        """The reclaimed messages to send to the consumer, held from now on (renewed);
        none if the consumer restarted under another name meanwhile (they wait out a
        lease and are taken again). Logs what was reclaimed and what was poison."""
        events: list[tuple[str, dict[str, Any]]] = [
            ("dead", {"msg_id": m, "type": self.type, "reason": "poison"}) for m in reclaim.poisoned
        ]
        messages = []
        for r in reclaim.claimed:
            try:
                message = Message.decode(r.msg_id, r.fields, self.type)
            except MalformedMessage:
                continue  # the consumer dead-letters what it cannot decode when it reads it
            messages.append(message)
            events.append(
                (
                    "reclaimed",
                    {
                        "task_id": message.task_id,
                        "schedule_id": message.schedule_id,
                        "type": self.type,
                        "msg_id": message.msg_id,
                        "from_consumer": r.owner,
                        "idle_ms": r.idle_ms,
                        "deliveries": r.deliveries,
                    },
                )
            )
        emit_events(self.actor, events)
        if self.state.name != name:
            return []
        for message in messages:  # held before the first await: renewed from now on
            self.state.held[message.msg_id] = message
        return messages

    async def prune(self, scripts: Scripts) -> list[str]:
        """Remove the type's consumers gone a while with nothing pending; this consumer
        takes over the poison ends their claimers left undone (done next tick)."""
        if self.state.name is None:
            return []
        names = await scripts.prune_consumers(self.type, CONSUMER_GONE_MS, self.state.name)
        emit_events(
            self.actor, [("consumer_removed", {"type": self.type, "consumer": n}) for n in names]
        )
        return names
