"""Bounded channels between actors, with one clear owner.

Actors talk through trio memory channels that are always bounded: a full channel makes the
sender wait (backpressure) instead of letting work pile up in memory. A ``Mailbox`` is opened
by whoever builds the tree and outlives the actors on either end, so a restarted actor finds
the same mailbox: actors borrow its ends and never close them; the node closes them when the
tree stops.
"""

from __future__ import annotations

from typing import Generic, TypeVar

import attrs
import trio

T = TypeVar("T")


@attrs.frozen
class Mailbox(Generic[T]):
    """Both ends of one bounded channel. Owned by the tree builder, borrowed by actors."""

    send: trio.MemorySendChannel[T]
    receive: trio.MemoryReceiveChannel[T]
    capacity: int

    @classmethod
    def open(cls, capacity: int) -> Mailbox[T]:
        if capacity < 1:
            raise ValueError(f"mailbox capacity must be >= 1, got {capacity}")
        send, receive = trio.open_memory_channel[T](capacity)
        return cls(send, receive, capacity)
