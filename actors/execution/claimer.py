"""The claimer of one task type: takes over messages whose consumer died.

Every ``claimer_interval_s`` it runs ``reclaim.lua`` for as many messages as its node's
consumer of the type has free slots: messages pending longer than the lease (their
consumer stopped renewing them: it died, or released them at shutdown) are claimed for
this node's consumer and handed to it through its mailbox; a message already delivered
``max_deliveries`` times is poison and goes to the dead-letter queue instead.

Every round it also trims the stream's acknowledged entries from its head
(``trim_acked.lua``: consumers acknowledge without deleting, which saves Redis an ``XDEL``
a fire). Every ``PRUNE_EVERY_S`` it also removes consumers that are gone (idle longer than
``CONSUMER_GONE_MS``) and hold nothing (``prune_consumers.lua``); a consumer with pending
messages is never removed.
"""

from __future__ import annotations

from typing import Any

import attrs
import trio

from actors.execution.consumer import ConsumerState
from actors.store.keys import CONSUMER_GONE_MS
from actors.store.messages import MalformedMessage, Message
from actors.store.scripts import Scripts
from actors.store.tasks import TaskStore
from runtime.actor import ActorContext, TaskStatus
from runtime.channels import Mailbox
from runtime.logging import emit_events

PRUNE_EVERY_S = 30.0


@attrs.frozen
class ClaimerSettings:
    """One type's claimer (built from ``[consumers.<type>]`` and ``[execution]``)."""

    interval_s: float = 1.0
    lease_s: float = 30.0
    """A message pending this long without renewal is taken over."""
    max_deliveries: int = 5
    """A message delivered this often is poison: to the DLQ instead."""


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

    async def run(self, ctx: ActorContext, *, task_status: TaskStatus) -> None:
        redis = self.store.client
        await redis.ride_out(self.store.keys)
        scripts = await self.store.scripts()
        self.actor = ctx.path
        task_status.started()
        last_prune = trio.current_time()
        while True:
            await trio.sleep(self.settings.interval_s)
            await redis.ride_out(lambda: self.tick(scripts))
            await redis.ride_out(lambda: scripts.trim_acked(self.type))
            if trio.current_time() - last_prune >= PRUNE_EVERY_S:
                await redis.ride_out(lambda: self.prune(scripts))
                last_prune = trio.current_time()

    async def tick(self, scripts: Scripts) -> int:
        """Reclaim up to the consumer's free slots; return how many were handed over."""
        name, free = self.state.name, self.state.free.value
        if name is None or free <= 0:
            return 0
        s = self.settings
        reclaim = await scripts.reclaim(
            self.type, name, int(s.lease_s * 1000), free, s.max_deliveries, self.node
        )
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
        for message in messages:
            await self.inbox.send.send(message)
        return len(messages)

    async def prune(self, scripts: Scripts) -> list[str]:
        names = await scripts.prune_consumers(self.type, CONSUMER_GONE_MS, self.state.name or "")
        emit_events(
            self.actor, [("consumer_removed", {"type": self.type, "consumer": n}) for n in names]
        )
        return names
