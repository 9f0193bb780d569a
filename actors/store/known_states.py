"""The state records a poller wrote with its commits, kept so that its next claims of the
same tasks need not read them back.

A task's state record is written by its partition's poller (``commit_fires.lua``) and by
API writes, nothing else (outcomes go to the run records), and every API write counts
itself in the partition's owner hash (``writes``: ``records.lua`` ``count_write``; a layout
migration counts too, and so does a commit that parks a task its flight holds instead of
writing the finished state the poller built). A claim that takes a partition over counts one as well
(``claim_due.lua``): another poller may have committed meanwhile. So while a partition's
count is the one a poller's commits ran at, the states it committed are the stored ones,
and a claim can return the due tasks' ids and scores alone (``claim_due.lua`` ARGV[10]):
one hash read and its reply a fire fewer. A claim that finds the count moved reads every
state, and the poller starts over for that partition from what it reads and commits.

A score that is not the one the poller committed is a miss: a hand edit, or a Redis back
from a restart or a failover without its last writes (the writes count may be rolled back
too, so it alone would not tell; but every commit moves a task's grid on, so an older state
is at another score, unless a jitter longer than the task's interval happens to land both
on the same millisecond). So is a task the poller does not know (not claimed since the
count moved, or not kept): a missed task's records are read in a second call
(``read_definitions.lua``), and the next claims of the partition read every state again,
until one finds each due task known (``complete``). So a partition whose tasks keep
changing costs what it did without this, plus at most one round trip a change.

Kept, as definitions are (``actors.store.definitions``), only for tasks that fire again
within ``KEEP_IF_NEXT_WITHIN_MS``, at most ``limit`` states (~300 bytes each, measured with
``tracemalloc``: the entry and the committed values it holds).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs

from actors.store.definitions import KEEP_IF_NEXT_WITHIN_MS

if TYPE_CHECKING:
    from actors.store.replies import FireCommit


@attrs.define
class _Partition:
    writes: int
    """The partition's count of writes the states below were committed at."""
    states: dict[str, tuple[int, list[Any]]] = attrs.field(factory=dict)
    """task id -> (score committed, state values committed)."""
    complete: bool = False
    """Whether the last claim of the partition found every due task here: the next one
    may leave the states out."""


class KnownStates:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._partitions: dict[int, _Partition] = {}
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def writes_to_ask(self, partition: int) -> int | None:
        """The count of writes at which a claim of ``partition`` may leave the states out,
        or None: read them."""
        known = self._partitions.get(partition)
        return known.writes if known is not None and known.complete else None

    def claimed(self, partition: int, writes: int) -> None:
        """A claim read the partition's count of writes: what was kept at another count
        is no longer known to be stored."""
        known = self._partitions.get(partition)
        if known is None or known.writes != writes:
            self.forget(partition)
            self._partitions[partition] = _Partition(writes)

    def of(self, partition: int) -> dict[str, tuple[int, list[Any]]]:
        """The partition's known states, task id -> (score, values) (read-only: a claim
        decoding many tasks looks each up here)."""
        known = self._partitions.get(partition)
        return known.states if known is not None else _NONE

    def kept_at(self, partition: int, writes: int) -> dict[str, tuple[int, list[Any]]]:
        """The partition's known states if kept at ``writes``, the count of writes a claim
        just read, else none (read-only: ``claimed`` is what forgets them)."""
        known = self._partitions.get(partition)
        return known.states if known is not None and known.writes == writes else _NONE

    def get(self, partition: int, task_id: str, score: float) -> list[Any] | None:
        """The state committed for ``task_id``, if kept and still at ``score``."""
        entry = self.of(partition).get(task_id)
        if entry is None or entry[0] != score:
            return None
        return entry[1]

    def completed(self, partition: int, complete: bool) -> None:
        """Whether the claim just read found every due task known."""
        known = self._partitions.get(partition)
        if known is not None:
            known.complete = complete

    def committed(self, partition: int, writes: int, commits: list[FireCommit]) -> None:
        """Commits that went through in full (none lost) of a claim that read ``writes``:
        their states are the stored ones. Kept for tasks that fire again within
        ``KEEP_IF_NEXT_WITHIN_MS`` (as definitions are); a finished task is dropped (it
        left the schedule)."""
        known = self._partitions.get(partition)
        if known is None or known.writes != writes:
            return
        states = known.states
        before = len(states)
        room = self._size + len(commits) <= self.limit
        for c in commits:  # per fire: kept lean
            score = c.score
            if score is not None and score - c.due_ms <= KEEP_IF_NEXT_WITHIN_MS:
                if room or c.task_id in states or self._size + len(states) - before < self.limit:
                    states[c.task_id] = (score, c.values)
            else:
                states.pop(c.task_id, None)
        self._size += len(states) - before

    def discard(self, partition: int, task_id: str) -> None:
        """Know nothing of ``task_id`` (its next claim reads it)."""
        known = self._partitions.get(partition)
        if known is not None and known.states.pop(task_id, None) is not None:
            self._size -= 1

    def forget(self, partition: int) -> None:
        """Drop what is kept of ``partition`` (a commit lost, a partition held elsewhere or
        let go)."""
        known = self._partitions.pop(partition, None)
        if known is not None:
            self._size -= len(known.states)


_NONE: dict[str, tuple[int, list[Any]]] = {}
