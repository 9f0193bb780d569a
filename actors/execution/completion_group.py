"""The consumers of one process write their batches of outcomes together.

Each type's consumer flushes its finished fires on its own rhythm, and a flush writes per
partition the fires touch (``actors.store.completion_writes``). A process that runs many
types would send each partition's outcome call once per type: ten types at 10,000 fires a
second made three times the script calls a fire that one type makes. So a consumer hands
its batch to the process's group: while one write is out, the batches that arrive wait,
and go together in the next one, sharing their outcome calls (a group commit, as a
database does with its log). A batch that finds no write out is written at once: one type alone
pays nothing for the group, and no batch waits longer than the write ahead of it.

Each batch keeps its own fate: its ACKs go only once its own writes went through, its
outcomes succeed or fail apart from the others' in the calls they share, and a batch whose
writes cannot be built (a value that does not encode) goes alone from then on, so the
error reaches its own consumer only. Callers must shield their call (the consumer does):
one cancelled while it waits would leave its batch to be written for nobody. The caller
repeats a failed batch (``ride_out``), with whatever batches wait then.
"""

from __future__ import annotations

import attrs
import trio

from actors.store.completion_writes import CompletionWrite
from actors.store.execution_scripts import ExecutionScripts
from runtime.errors import RedisUnavailable


@attrs.define(eq=False)
class _Entry:
    write: CompletionWrite
    done: bool = False
    error: BaseException | None = None


class CompletionGroup:
    """Batches of one process's consumers, written together (one per process, shared by
    its consumers; a consumer built without one has its own)."""

    def __init__(self) -> None:
        self._waiting: list[_Entry] = []
        self._lock = trio.Lock()
        self.writes = 0
        """Writes made (each carries one or more batches)."""
        self.batches = 0
        """Batches written (they share ``writes`` calls)."""

    async def complete(self, scripts: ExecutionScripts, write: CompletionWrite) -> None:
        """Write ``write`` (``ExecutionScripts.complete``) with the batches waiting
        alongside it (or alone, once it is to go alone); raise the first of its writes that
        failed. Called shielded, as the consumer does: a batch cut off halfway would leave
        its fellows' unknown too."""
        entry = _Entry(write)
        self._waiting.append(entry)
        async with self._lock:
            if not entry.done:
                if write.alone:
                    self._waiting.remove(entry)
                    entries = [entry]
                else:
                    entries = [e for e in self._waiting if not e.write.alone]
                    self._waiting = [e for e in self._waiting if e.write.alone]
                try:
                    await self._write(scripts, entries)
                finally:
                    for e in entries:  # cancelled: the others repeat theirs, as after an outage
                        if not e.done:
                            e.done, e.error = True, _cut_off()
        if entry.error is not None:
            raise entry.error

    async def _write(self, scripts: ExecutionScripts, entries: list[_Entry]) -> None:
        self.writes += 1
        self.batches += len(entries)
        try:
            errors = await scripts.complete([e.write for e in entries])
        except RedisUnavailable as exc:  # an outage: every batch repeats what is not written
            for e in entries:
                e.done, e.error = True, exc
            return
        except Exception as exc:
            if len(entries) == 1:
                entries[0].done, entries[0].error = True, exc
                return
            # Not Redis's answer: a batch whose writes cannot be built (a value that does
            # not encode). Each goes alone next, so the error reaches its own batch only,
            # and the others are written.
            for e in entries:
                e.write.alone = True
                e.done, e.error = True, _cut_off()
            return
        for e, error in zip(entries, errors, strict=True):
            e.done, e.error = True, error


def _cut_off() -> RedisUnavailable:
    return RedisUnavailable("the write this batch went with was cut off; it is sent again")
