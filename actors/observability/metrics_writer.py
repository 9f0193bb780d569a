"""Writes a process's event counts to its metrics a few times a second, not per batch.

In multiprocess mode (a node's processes share their samples through memory-mapped files)
every counter or bucket increment is a locked file write. Written per batch of events, a
node with many task types, each making small batches, spent a sixth of a consumer
process's CPU there (12 types at 5,000 fires/s). While this actor runs, ``count_events``
only tallies; the actor writes the tallies every ``WRITE_EVERY_S`` and, as it stops, the
rest, after which batches are written at once again (a role's last lines at shutdown).
A process killed with SIGKILL loses at most its last ``WRITE_EVERY_S`` of counts; a scrape
sees a count at most that much later than its line.
"""

from __future__ import annotations

import trio

from actors.observability.metrics import gather_writes, write_gathered
from runtime.actor import ActorContext, TaskStatus

#: How often the gathered counts are written (a scrape interval is seconds).
WRITE_EVERY_S = 0.25


class MetricsWriter:
    async def run(self, ctx: ActorContext, *, task_status: TaskStatus) -> None:
        """Actor: gather this process's counts and write them every ``WRITE_EVERY_S``."""
        gather_writes(True)
        task_status.started()
        try:
            while True:
                await trio.sleep(WRITE_EVERY_S)
                write_gathered()
        finally:
            gather_writes(False)
