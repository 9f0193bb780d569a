"""The claimer of one task type: takes over messages whose consumer died.

Every ``claimer_interval_s`` it runs ``reclaim.lua`` for as many messages as its node's
consumer of the type has free slots: messages pending longer than the lease (their
consumer stopped renewing them: it died, or released them at shutdown) are claimed for
this node's consumer and handed to it through its mailbox; a message already delivered
``max_deliveries`` times is poison and goes to the dead-letter queue instead.

Every minute it also removes consumers that are gone and hold nothing
(``prune_consumers.lua``); a consumer with pending messages is never removed.
"""

from __future__ import annotations

import attrs
import trio

from actors.config import ConsumerSection
from actors.execution.consumer import ConsumerState
from actors.store import scripts
from actors.store.keys import GROUP, Keys
from actors.store.messages import MalformedMessage, Message, flat_fields
from actors.store.tasks import TaskStore
from runtime.actor import ActorContext, TaskStatus
from runtime.channels import Mailbox
from runtime.logging import emit_events

PRUNE_EVERY_S = 60.0


@attrs.frozen
class ClaimerSettings:
    interval_s: float = 1.0


class Claimer:
    def __init__(
        self,
        store: TaskStore,
        task_type: str,
        section: ConsumerSection,
        state: ConsumerState,
        inbox: Mailbox[Message],
        node: str,
        settings: ClaimerSettings,
    ) -> None:
        self.store = store
        self.type = task_type
        self.section = section
        self.state = state
        self.inbox = inbox
        self.node = node
        self.settings = settings
        self.actor = f"node/consumers/{task_type}/claimer"

    async def run(self, ctx: ActorContext, *, task_status: TaskStatus) -> None:
        keys = await self.store.keys()
        self.actor = ctx.path
        task_status.started()
        last_prune = trio.current_time()
        while True:
            await trio.sleep(self.settings.interval_s)
            await self.tick(keys)
            if trio.current_time() - last_prune >= PRUNE_EVERY_S:
                await self.prune(keys)
                last_prune = trio.current_time()

    async def tick(self, keys: Keys) -> int:
        """Reclaim up to the consumer's free slots; return how many were handed over."""
        name, free = self.state.name, self.state.free.value
        if name is None or free <= 0:
            return 0
        claimed, poisoned = await self.store.client.script(
            scripts.RECLAIM,
            [keys.queue(self.type), keys.dlq(self.type)],
            [
                GROUP, name, int(self.section.lease_s * 1000), free,
                self.section.max_deliveries, self.node,
            ],
        )  # fmt: skip
        events = [
            ("dead", {"msg_id": m.decode(), "type": self.type, "reason": "poison"})
            for m in poisoned
        ]
        messages = []
        for msg_id, owner, idle, deliveries, fields in claimed:
            try:
                message = Message.decode(msg_id, flat_fields(fields))
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
                        "from_consumer": owner.decode(),
                        "idle_ms": int(idle),
                        "deliveries": int(deliveries),
                    },
                )
            )
        emit_events(self.actor, events)
        for message in messages:
            await self.inbox.send.send(message)
        return len(messages)

    async def prune(self, keys: Keys) -> list[str]:
        min_idle_ms = int(max(10 * self.section.lease_s, 60) * 1000)
        removed = await self.store.client.script(
            scripts.PRUNE_CONSUMERS,
            [keys.queue(self.type)],
            [GROUP, min_idle_ms, self.state.name or ""],
        )
        names = [r.decode() for r in removed]
        emit_events(
            self.actor, [("consumer_removed", {"type": self.type, "consumer": n}) for n in names]
        )
        return names
