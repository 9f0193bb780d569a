"""One process's turn for its suspects (``Reader.run_alone``): while a suspect runs, it is
the only handler the process runs, so a death of the process then counts against it
alone (``count_delivery.lua``).

Every consumer of the process shares one ``Alone``. A suspect's turn closes the process to
new starts of every type, waits for the handlers already running to end (their outcomes may
still be waiting for a flush: a death then does not count against them, they are past their
handler), runs the suspect and opens again once it is settled. Turns come one at a time.
All of this happens only at a consumer's start after its process died holding messages
delivered ``max_deliveries`` - 2 times: the price, that the process's other types wait
meanwhile, is paid only by a process that keeps dying.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import trio
import trio_util


class Alone:
    """The shared turn (one per process, given to each of its consumers)."""

    def __init__(self) -> None:
        self._lock = trio.Lock()
        self._turn = trio_util.AsyncBool(False)
        self._pools: dict[int, tuple[trio_util.AsyncValue[int], int]] = {}

    def add_pool(self, free: trio_util.AsyncValue[int], size: int) -> None:
        """A consumer's handler slots (``free`` of ``size``), for as long as it runs."""
        self._pools[id(free)] = (free, size)

    def forget_pool(self, free: trio_util.AsyncValue[int]) -> None:
        self._pools.pop(id(free), None)

    @contextlib.asynccontextmanager
    async def turn(self) -> AsyncIterator[None]:
        """Nothing else runs in the process from when this is entered until it is left."""
        async with self._lock:
            self._turn.value = True
            try:
                for free, size in list(self._pools.values()):
                    await free.wait_value(lambda value, size=size: value >= size)
                yield
            finally:
                self._turn.value = False

    async def wait_to_start(self) -> None:
        """Return at once unless a suspect has the turn; then once it is over. Called right
        before a start, with no wait between the two."""
        while self._turn.value:
            await self._turn.wait_value(False)
