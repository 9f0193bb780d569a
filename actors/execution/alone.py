"""One process's turn for its suspects (``Reader.run_alone``): while a suspect runs, it is
the only handler the process runs, so a death of the process then counts as a delivery
against it (``count_delivery.lua``) and against no other message that was running.

Every consumer of the process shares one ``Alone``. A suspect's turn closes the process to
new reads and starts of every type, waits for the handlers already running to end, runs
the suspect and opens again once it is settled. Turns come one at a time. A death during a
turn still counts one delivery against each message the process held without running it
(read, or finished and not yet acknowledged), as at any death; ``recover.lua`` counts
those only up to ``max_deliveries`` - 2, never to poison. A thread a timed-out plain
handler left running (``Runner.hung``) is not waited for: it may still die beside a
suspect. All of this happens only at a consumer's start after its process died holding
messages delivered ``max_deliveries`` - 2 times: the price, that the process's other types
wait meanwhile, is paid only by a process that keeps dying.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import AsyncIterator, Callable

import trio
import trio_util


class Alone:
    """The shared turn (one per process, given to each of its consumers)."""

    def __init__(self) -> None:
        self._lock = trio.Lock()
        self._turn = trio_util.AsyncBool(False)
        self._pools: dict[object, tuple[trio_util.AsyncValue[int], int]] = {}
        self._forgotten = trio_util.AsyncValue(0)
        """Counts ``forget_pool`` calls: a turn waiting on a consumer that stopped goes on."""

    @property
    def closed(self) -> bool:
        """Whether a suspect has the turn (checked inline on the hot path)."""
        return bool(self._turn.value)

    def add_pool(self, free: trio_util.AsyncValue[int], size: int) -> None:
        """A consumer's handler slots (``free`` of ``size``), for as long as it runs."""
        self._pools[free] = (free, size)

    def forget_pool(self, free: trio_util.AsyncValue[int]) -> None:
        self._pools.pop(free, None)
        self._forgotten.value += 1

    @contextlib.asynccontextmanager
    async def turn(self) -> AsyncIterator[None]:
        """Nothing else runs in the process from when this is entered until it is left."""
        async with self._lock:
            self._turn.value = True
            try:
                for key, (free, size) in list(self._pools.items()):
                    while key in self._pools and free.value < size:
                        await trio_util.wait_any(
                            functools.partial(free.wait_value, _at_least(size)),
                            functools.partial(
                                self._forgotten.wait_value, _other_than(self._forgotten.value)
                            ),
                        )
                yield
            finally:
                self._turn.value = False

    async def wait_to_start(self) -> None:
        """Return once no suspect has the turn. Called right before a read or a start, with
        no wait between the two."""
        while self._turn.value:
            await self._turn.wait_value(False)


def _at_least(size: int) -> Callable[[int], bool]:
    return lambda value: value >= size


def _other_than(seen: int) -> Callable[[int], bool]:
    return lambda value: value != seen
