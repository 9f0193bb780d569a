"""The definitions a poller has read, kept by task version, so its claims need not read
them again.

A task's definition (type, payload, schedule) changes only by an API write, and every API
write gives the task a new version (its ``updated_ms``: ``records.lua`` ``new_version``,
later than any version its partition gave before, so a version is never given twice, not
even to a task deleted and created again under the same id within a millisecond). So a
definition read at version V is the task's definition for as long as its state says V.

With a cache, ``claim_due.lua`` returns the claimed tasks' state records only, and the
poller reads the definitions it does not have in a second call (``read_definitions.lua``,
with the state again: one whose version moved meanwhile is left due for the next tick).
Once every due task has been claimed once, a claim reads one record a task instead of two:
one Redis hash read and its reply a fire fewer (~3 µs of Redis CPU at 10,000 fires/s),
for ~560 bytes of poller memory a task kept (``bench fire``, docs/PERFORMANCE.md), up
to ``limit`` tasks, and only tasks that fire again within ``KEEP_IF_NEXT_WITHIN_MS``.
"""

from __future__ import annotations

from typing import Any

import attrs

from actors.domain.schedules import Schedule

#: Most definitions a poller keeps by default (~110 MB of its memory when full: ~560 bytes
#: each, measured); a poller serving more due tasks reads the rest with each claim.
DEFAULT_CACHED_DEFINITIONS = 200_000

#: A definition is kept only if its task fires again within this of the fire claimed: the
#: tasks that load Redis fire often; a once task never comes back, and an hourly or daily
#: one would hold memory for a read saved an hour later.
KEEP_IF_NEXT_WITHIN_MS = 300_000


@attrs.define  # not frozen: built per task read, and a frozen class costs ~4x to build
class Definition:
    """What a claimed task's definition record holds that a poller uses."""

    type: str
    payload: bytes
    schedule: Schedule
    created_ms: int = 0
    """The task's creation version (0: a record without one): a task deleted and created
    again under its id has another, which its failure limit's fires carry
    (``actors.store.flights.task_policy_code``)."""


class DefinitionCache:
    """Definitions by partition and task id, each with the version it was read at.

    Bounded by ``limit`` tasks. When full, a task read is not added, and once a quarter of
    ``limit`` such reads were turned away the entries not used since the last sweep go
    (deleted tasks, tasks of partitions now served elsewhere): tasks that fire stay, and
    when more tasks fire than fit, the ones kept stay kept (the others are read with each
    claim). A partition's entries go when its poller stops serving it (``forget``)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._partitions: dict[int, dict[str, list[Any]]] = {}
        """partition -> task id -> [version, Definition, used since the last sweep]."""
        self._size = 0
        self._turned_away = 0

    def __len__(self) -> int:
        return self._size

    @staticmethod
    def worth_keeping(definition: Definition, due_ms: int) -> bool:
        """Whether a task due at ``due_ms`` fires again soon enough to be kept."""
        next_ms = definition.schedule.next_after(due_ms)
        return next_ms is not None and next_ms - due_ms <= KEEP_IF_NEXT_WITHIN_MS

    def get(self, partition: int, task_id: str, version: int) -> Definition | None:
        """The definition of ``task_id`` at ``version``, if kept."""
        entry = self._partitions.get(partition, _NONE).get(task_id)
        if entry is None or entry[0] != version:
            return None
        entry[2] = True
        definition: Definition = entry[1]
        return definition

    def put(self, partition: int, task_id: str, version: int, definition: Definition) -> None:
        """Keep ``definition`` as the task's at ``version`` (replacing an older one)."""
        tasks = self._partitions.setdefault(partition, {})
        entry = tasks.get(task_id)
        if entry is not None:
            entry[0], entry[1], entry[2] = version, definition, True
            return
        if self._size >= self.limit:
            self._turned_away += 1
            if self._turned_away < max(1, self.limit // 4):
                return
            self._sweep()
            if self._size >= self.limit:
                return
        tasks[task_id] = [version, definition, True]
        self._size += 1

    def forget(self, partition: int) -> None:
        """Drop what is kept of ``partition``."""
        self._size -= len(self._partitions.pop(partition, {}))

    def _sweep(self) -> None:
        """Drop the entries not used since the last sweep; mark the rest unused."""
        self._turned_away = 0
        for tasks in self._partitions.values():
            for task_id in [t for t, entry in tasks.items() if not entry[2]]:
                del tasks[task_id]
            for entry in tasks.values():
                entry[2] = False
        self._size = sum(len(tasks) for tasks in self._partitions.values())


_NONE: dict[str, list[Any]] = {}
