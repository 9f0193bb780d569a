"""Listing tasks through an index, with filters: by type, status, labels, next fire and
last outcome.

A listing walks one index bucket by bucket, partition by partition (``ListCursor``): the
type index of each type in turn, or, with at least one label filter, the index of the
first label pair alone (``{ns:P}:label:<k>=<v>:<B>``), so a selective label costs reads of
its own tasks only. Every other filter is checked on the tasks read. A task's labels live
outside its definition and state records (``{ns:P}:labels``): a task without labels
stores nothing more, and the fire path never reads them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import attrs
import structlog

from actors.domain.errors import InvalidTask
from actors.domain.labels import label_key_problem, label_value_problem
from actors.domain.model import STATUSES, Task
from actors.store.history import FATE_NAMES
from actors.store.keys import Keys
from actors.store.placement import ListCursor
from actors.store.records import OUTCOME_NAMES
from runtime.config import check_name
from runtime.redis_io import RedisClient

if TYPE_CHECKING:
    from actors.store.tasks import TaskStore

#: The ``actor`` field of the store's lines (it runs inside API, CLI or resumer calls).
STORE_ACTOR = "store"

#: Most index buckets one listing round trip reads: a partition's worth by default. It
#: starts at one for each index read and grows fourfold while the buckets it reads hold
#: fewer tasks than the page still needs, and no further than what is left of
#: ``MAX_LIST_READ`` would fill at the tasks a bucket of that index held so far
#: (``_Density``): a common type costs no read-ahead, and a small namespace (16 partitions
#: of 1024 mostly empty buckets) is listed in ~20 round trips, one page.
MAX_LIST_SPAN = 1024
#: Most tasks one page request reads, matching or not: a filter that keeps few tasks of
#: many (a rare status at ten million) answers a short or empty page and a cursor after
#: about this many, instead of reading the namespace in one request.
MAX_LIST_READ = 5_000


@attrs.frozen
class TaskFilter:
    """What a listing keeps; None (or no labels) = any."""

    task_type: str | None = None
    status: str | None = None
    labels: Mapping[str, str] = attrs.field(factory=dict)
    """Every pair must be among the task's labels."""
    next_before: int | None = None
    """Unix ms: the task's next fire is at or before it (a task that never fires again
    does not match)."""
    last_status: str | None = None
    """The outcome of the task's last run: ``ok``, ``retry`` or ``dead``."""
    last_fate: str | None = None
    """The fate of the task's latest occurrence (``actors.store.history.FATES``)."""

    def __attrs_post_init__(self) -> None:
        if self.task_type is not None:
            try:
                check_name("type", self.task_type)
            except ValueError as exc:
                raise InvalidTask(f"type: {exc}") from None
        if self.status is not None and self.status not in STATUSES:
            raise InvalidTask(f"status: must be one of {', '.join(STATUSES)}, got {self.status!r}")
        if self.last_status is not None and self.last_status not in OUTCOME_NAMES:
            raise InvalidTask(
                f"last_status: must be one of {', '.join(OUTCOME_NAMES)}, got {self.last_status!r}"
            )
        if self.last_fate is not None and self.last_fate not in FATE_NAMES:
            raise InvalidTask(
                f"last_fate: must be one of {', '.join(FATE_NAMES)}, got {self.last_fate!r}"
            )
        if self.next_before is not None and (
            not isinstance(self.next_before, int) or self.next_before < 0
        ):
            raise InvalidTask(f"next_before: must be Unix ms (>= 0), got {self.next_before!r}")
        for key, value in self.labels.items():  # a selector's own: checked apart (a key
            problem = label_key_problem(key) or label_value_problem(value)  # may hold =)
            if problem is not None:
                raise InvalidTask(f"labels: {problem}")

    def matches(self, task: Task) -> bool:
        return (
            (self.task_type is None or task.type == self.task_type)
            and (self.status is None or task.status == self.status)
            and (self.last_status is None or task.last_status == self.last_status)
            and (self.last_fate is None or task.last_fate == self.last_fate)
            and (
                self.next_before is None
                or (task.next_run_ms is not None and task.next_run_ms <= self.next_before)
            )
            and all(task.labels.get(k) == v for k, v in self.labels.items())
        )


async def index_members(
    client: RedisClient, key_of: Callable[[int], str], buckets: range
) -> list[tuple[str, int]]:
    """Every (task id, bucket) in these buckets of one index (``key_of(bucket)``): one
    pipelined round trip, more only for a bucket grown past the compact encoding (HSCAN
    pages it)."""
    members: list[tuple[str, int]] = []
    scans = [(bucket, 0) for bucket in buckets]
    while scans:
        replies = await client.reads(  # a key of another kind: raised (redis_rejected)
            [("HSCAN", key_of(bucket), scan, "COUNT", 1000) for bucket, scan in scans]
        )
        following = []
        for (bucket, _), (scan, fields) in zip(scans, replies, strict=True):
            # redis-py answers HSCAN with a dict (field -> value)
            names = fields if isinstance(fields, dict) else fields[::2]
            members += [(task_id.decode(errors="replace"), bucket) for task_id in names]
            if int(scan):
                following.append((bucket, int(scan)))
        scans = following
    return members


IndexKey = Callable[[int, int], str]
"""One index: (partition, bucket) -> its key."""


def _type_index(keys: Keys, task_type: str) -> IndexKey:
    return lambda p, b: keys.by_type(p, task_type, b)


def walked_indexes(keys: Keys, wanted: TaskFilter, types: Sequence[str]) -> list[IndexKey]:
    """The indexes the listing walks, in order."""
    if wanted.labels:
        key, value = next(iter(wanted.labels.items()))
        return [lambda p, b: keys.by_label(p, key, value, b)]
    return [_type_index(keys, t) for t in types]


@attrs.define
class _Density:
    """How many buckets a listing's next round trip reads from the index it is in."""

    span: int = 1
    buckets: int = 0
    tasks: int = 0

    def read(self, buckets: int, tasks: int, wanted: int, budget: int) -> None:
        """After reading ``tasks`` in ``buckets``: read four times as many buckets next if
        they held fewer than the page still ``wanted``, and never more than the tasks left
        of the call's ``budget`` would fill at the tasks a bucket held so far."""
        self.buckets, self.tasks = self.buckets + buckets, self.tasks + tasks
        if tasks < wanted:
            self.span = min(self.span * 4, MAX_LIST_SPAN)
        if self.tasks:
            self.span = max(1, min(self.span, budget * self.buckets // self.tasks))


async def list_page(
    store: TaskStore, wanted: TaskFilter, cursor: str | None, limit: int, max_calls: int,
    unreadable: list[tuple[str, str]] | None = None,
) -> tuple[list[Task], str | None]:  # fmt: skip
    """A page of the tasks ``wanted`` keeps, from ``cursor`` on (``TaskStore.list_tasks``)."""
    keys = await store.keys()
    if wanted.task_type or wanted.labels:
        types = [wanted.task_type] if wanted.task_type else []
    else:
        types = await store.types()
    indexes = walked_indexes(keys, wanted, types)
    names = types if not (wanted.task_type or wanted.labels) else None
    position = ListCursor.parse(cursor, len(indexes), keys.partitions, keys.buckets, names)
    tasks: list[Task] = []
    last: tuple[int, str] | None = None  # (bucket, id) of the last task in ``tasks``
    calls, read = 0, 0
    density = _Density()  # of the index being read: each index's buckets fill alike
    while position is not None and len(tasks) < limit and calls < max_calls:
        if read >= MAX_LIST_READ:  # a short page now, the rest from its cursor
            break
        calls += 1
        # A bucket's ids in order: a page that fills in a bucket ends at an id in it.
        index, first = position.type_index, position.bucket
        end = min(first + density.span, keys.buckets)
        key_of = functools.partial(indexes[index], position.partition)
        members = sorted(
            (bucket, task_id)
            for task_id, bucket in await index_members(store.client, key_of, range(first, end))
            if position.after is None or bucket != first or task_id > position.after
        )
        named = len(unreadable) if unreadable is not None else 0
        found = await store.get_many([task_id for _, task_id in members], unreadable)
        # a type's index may name an id of another type now (its task deleted when its
        # definition could not be read, then created again as another type): listed
        # under its own type's index alone
        of_type = types[index] if not wanted.labels else None
        for k, (place, task) in enumerate(zip(members, found, strict=True)):
            if len(tasks) == limit:  # the page is full: the next one starts after ``last``
                assert last is not None  # appended in this round trip (limit >= 1)
                if unreadable is not None:  # those after it are the next page's to name
                    later = {task_id for _, task_id in members[k:]}
                    unreadable[named:] = [u for u in unreadable[named:] if u[0] not in later]
                return tasks, attrs.evolve(position, bucket=last[0], after=last[1]).format(names)
            if task is None or not wanted.matches(task) or of_type not in (None, task.type):
                continue
            tasks.append(task)
            last = place
        read += len(members)
        position = position.advance(end, len(indexes), keys.partitions, keys.buckets)
        if position is not None and position.type_index != index:
            density = _Density()  # another type's (or label's) index: start small again
        else:
            density.read(end - first, len(members), limit - len(tasks), MAX_LIST_READ - read)
    return tasks, (position.format(names) if position is not None else None)


def say_unreadable(unreadable: Sequence[tuple[str, str]]) -> None:
    """A ``task_unreadable`` error line for each task a walk over many (an action, a
    backfill of a type) went past because its records cannot be read."""
    log = structlog.get_logger().bind(actor=STORE_ACTOR)
    for task_id, why in unreadable:
        log.error("task_unreadable", task_id=task_id, error=why)
