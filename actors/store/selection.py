"""Selectors: which tasks an operator's action covers (``POST /v1/tasks/actions``).

A selector is the listing's filters (``TaskFilter``: type, status, labels, next fire, last
outcome; ``GET /v1/tasks`` takes the same, checked by the same code) and optionally a list
of task ids. It is resolved one partition at a time, through the indexes a listing walks
(``actors.store.labels.walked_indexes``), and a partition's matching tasks come back
sorted by id: an action applies them in that order, so the last id done is all a
partition's progress mark needs to say (``action_batch.lua``).

A selector is resolved again whenever its partition is applied (the first time, or after
a node applying it died): an action covers the tasks that match when their partition is
applied.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from actors.domain.errors import InvalidTask
from actors.domain.model import MAX_TASK_ID, Task
from actors.store.labels import TaskFilter, index_members, say_unreadable, walked_indexes
from runtime.config import check_name

if TYPE_CHECKING:
    from actors.store.tasks import TaskStore

#: Most task ids a selector may name.
MAX_IDS = 10_000
#: Task ids a dry run shows.
SAMPLE = 20
#: Tasks read per round trip while resolving a partition.
_READ = 1000


@attrs.frozen
class Selector:
    """The tasks an action covers: those ``filter`` keeps (of ``ids`` alone when given).
    ``all`` says an empty selector (every task) is meant."""

    filter: TaskFilter = attrs.field(factory=TaskFilter)
    ids: tuple[str, ...] | None = None
    all: bool = False

    def __attrs_post_init__(self) -> None:
        if self.ids is not None:
            if not 1 <= len(self.ids) <= MAX_IDS:
                raise InvalidTask(f"selector.ids: give 1-{MAX_IDS} task ids, got {len(self.ids)}")
            for i, task_id in enumerate(self.ids):
                try:
                    check_name("task_id", task_id, MAX_TASK_ID)
                except (ValueError, TypeError) as exc:
                    raise InvalidTask(f"selector.ids[{i}]: {exc}") from None
        if self.empty and not self.all:
            raise InvalidTask(
                "selector: an empty selector matches every task; give filters or ids, or "
                '"all": true to act on every task'
            )

    @property
    def empty(self) -> bool:
        return self.ids is None and self.filter == TaskFilter()

    def to_dict(self) -> dict[str, Any]:
        """The API form, only what is set (stored with the action, logged, answered)."""
        f = self.filter
        out: dict[str, Any] = {
            "type": f.task_type, "status": f.status, "next_before": f.next_before,
            "last_status": f.last_status, "last_fate": f.last_fate,
        }  # fmt: skip
        out = {k: v for k, v in out.items() if v is not None}
        if f.labels:
            out["labels"] = dict(f.labels)
        if self.ids is not None:
            out["ids"] = list(self.ids)
        if self.all:
            out["all"] = True
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Selector:
        """``to_dict``'s form back (a stored action's selector)."""
        ids = data.get("ids")
        return cls(
            TaskFilter(
                data.get("type"), data.get("status"), dict(data.get("labels") or {}),
                data.get("next_before"), data.get("last_status"), data.get("last_fate"),
            ),
            None if ids is None else tuple(ids),
            bool(data.get("all", False)),
        )  # fmt: skip


async def select_partition(store: TaskStore, selector: Selector, partition: int) -> list[Task]:
    """The partition's tasks the selector matches now, sorted by id."""
    keys = await store.keys()
    wanted = selector.filter
    if selector.ids is not None:
        ids = {i for i in selector.ids if keys.partition_of(i) == partition}
    else:
        if wanted.task_type or wanted.labels:
            types = [wanted.task_type] if wanted.task_type else []
        else:
            types = await store.types()
        ids = set()
        for index in walked_indexes(keys, wanted, types):
            key_of = functools.partial(index, partition)
            members = await index_members(store.client, key_of, range(keys.buckets))
            ids.update(task_id for task_id, _ in members)
    ordered = sorted(ids)
    tasks: list[Task] = []
    for i in range(0, len(ordered), _READ):
        found = await readable_tasks(store, ordered[i : i + _READ])
        tasks += [t for t in found if t is not None and wanted.matches(t)]
    return tasks


async def readable_tasks(store: TaskStore, task_ids: Sequence[str]) -> list[Task | None]:
    """``get_many`` for an action: a task whose records cannot be read is None (matched
    by no selector, left as it is) and said in a ``task_unreadable`` error line, so one
    broken record does not stop an action over the others."""
    unreadable: list[tuple[str, str]] = []
    found = await store.get_many(task_ids, unreadable)
    say_unreadable(unreadable)
    return found


async def count_matches(store: TaskStore, selector: Selector) -> tuple[int, list[str]]:
    """How many tasks the selector matches now, and the first ``SAMPLE`` of their ids (in
    the order an action applies them: by partition, then id). Reads only."""
    keys = await store.keys()
    count, sample = 0, list[str]()
    for partition in range(keys.partitions):
        tasks = await select_partition(store, selector, partition)
        count += len(tasks)
        sample += [t.task_id for t in tasks[: SAMPLE - len(sample)]]
    return count, sample


def sorted_after(tasks: Sequence[Task], mark: str) -> list[Task]:
    """The tasks (sorted by id) after a partition's mark, the last id done ('' = none)."""
    return [t for t in tasks if t.task_id > mark] if mark else list(tasks)
