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

    def finish(self, outcome: Outcome) -> None:
        self.done.append(outcome)
        self.done_event.set()

    def take(self) -> list[Outcome]:
        """The finished runs, for one batch; the next batch starts empty."""
        batch, self.done = self.done, []
        return batch

    def settled(self, batch: list[Outcome]) -> None:
        """These are acknowledged (or dead-lettered): no longer in flight."""
        for o in batch:
            self.messages.pop(o.message.msg_id, None)
