"""Writes a process's event counts to its metrics about every 0.25 s, not per batch.

In multiprocess mode (a node's processes share their samples through memory-mapped files)
every counter or bucket increment is a locked file write, and a node with many task types
makes small batches of each: written per batch, those writes are a few per cent of a
consumer process at 5,000 fires/s over 12 types (docs/PERFORMANCE.md, "Metric writes").
While this actor runs, ``count_events`` only tallies; the actor writes the tallies every
``WRITE_EVERY_S`` and, as it stops, the rest, after which batches are written at once
again (a role's last lines at shutdown). A process killed with SIGKILL loses the counts it
had not written (about its last ``WRITE_EVERY_S``); a scrape sees a count about that much
later than its line.
"""

from __future__ import annotations

from collections.abc import Sequence

import trio

from actors.observability.metrics import declare_series, gather_writes, write_gathered
from runtime.actor import ActorContext, TaskStatus

#: How often the gathered counts are written (a scrape interval is seconds).
WRITE_EVERY_S = 0.25
#: At most one ``metrics_not_written`` line this often while writes keep failing.
FAILURE_EVERY_S = 60.0


class MetricsWriter:
    def __init__(self, types: Sequence[str] = ()) -> None:
        self.types = types
        """The node's task types: their dead letters' series are laid down at 0."""

    async def run(self, ctx: ActorContext, *, task_status: TaskStatus) -> None:
        """Actor: gather this process's counts and write them every ``WRITE_EVERY_S``."""
        said_at: float | None = None  # when a failed write was last said
        try:
            declare_series(self.types)
            gather_writes(True)
            task_status.started()
            while True:
                await trio.sleep(WRITE_EVERY_S)
                try:
                    write_gathered()
                except OSError as exc:  # the metrics directory's disk full, say
                    # Those counts are lost; the node's work goes on, and says so.
                    if said_at is None or trio.current_time() - said_at >= FAILURE_EVERY_S:
                        said_at = trio.current_time()
                        ctx.log.warning("metrics_not_written", error=repr(exc))
        finally:
            gather_writes(False)
