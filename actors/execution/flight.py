"""What one run of a consumer holds: the messages read and not yet acknowledged, and the
finished runs waiting for the flush. Shared by the consumer's reading, running,
completing and lease-renewing parts; a restarted consumer starts with a new one."""

from __future__ import annotations

import attrs
import trio

from actors.execution.completion import Completion, Outcome
from actors.store.completion_writes import CompletionWrite
from actors.store.messages import Message


@attrs.define
class Flight:
    messages: dict[str, Message] = attrs.field(factory=dict)
    """Read and not yet acknowledged, by id (running, or finished and awaiting the flush)."""
    done: list[Outcome] = attrs.field(factory=list)
    """Finished, not yet completed in Redis."""
    done_event: trio.Event = attrs.field(factory=trio.Event)
    unsettled: tuple[list[Outcome], Completion, CompletionWrite] | None = None
    """The batch being completed, from when it is taken until it is settled: a flush cut
    off (the consumer stopping) leaves it here, and the next flush (the consumer's last)
    goes on with it, the writes already done kept, its results lines not written again."""
    unlogged: list[str] = attrs.field(factory=list)
    """The unsettled batch's results lines, until they are written."""

    def finish(self, outcome: Outcome) -> None:
        self.done.append(outcome)
        self.done_event.set()

    def take(self) -> list[Outcome]:
        """The finished runs, for one batch; the next batch starts empty."""
        batch, self.done = self.done, []
        return batch

    waiters: dict[str, trio.Event] = attrs.field(factory=dict)
    """Set when the message of that id is settled (``until_settled``)."""
    held: set[str] = attrs.field(factory=set)
    """Ids of messages held back (``held_back``), until settled."""

    def settled(self, batch: list[Outcome]) -> None:
        """These are acknowledged (or dead-lettered): no longer in flight."""
        for o in batch:
            self.messages.pop(o.message.msg_id, None)
            waiter = self.waiters.pop(o.message.msg_id, None)
            if waiter is not None:
                waiter.set()
        if self.held:
            self.held.difference_update(o.message.msg_id for o in batch)

    def held_back(self, batch: list[Outcome]) -> None:
        """These ran and wait for Redis to take their outcomes (``actors.execution.held_back``):
        still in flight (renewed), but whoever waits for them to settle (a suspect's turn,
        which must not keep the process's reads closed while a partition is broken) waits
        no more; settled later all the same."""
        for o in batch:
            self.held.add(o.message.msg_id)
            waiter = self.waiters.pop(o.message.msg_id, None)
            if waiter is not None:
                waiter.set()

    async def until_settled(self, msg_id: str) -> None:
        """Wait for the message ``msg_id`` in flight to be settled (or held back)."""
        if msg_id in self.messages and msg_id not in self.held:
            await self.waiters.setdefault(msg_id, trio.Event()).wait()
