"""Whole-type and whole-namespace scans of the task store: counting tasks by status (every
state record read) and deleting every task of a type (through the type's index), each in
short calls that yield between them, so neither holds Redis or the caller for long."""

from __future__ import annotations

from typing import TYPE_CHECKING

import trio.lowlevel

from actors.domain.model import STATUSES
from actors.store.keys import Keys
from actors.store.labels import index_members
from actors.store.records import status_index
from runtime.config import check_name
from runtime.logging import get_logger
from runtime.redis_replies import reply_text

if TYPE_CHECKING:
    from actors.store.tasks import TaskStore

#: Ids per delete script call when clearing a type: keeps each call well under a millisecond.
CLEAR_BATCH = 500
#: Type-index buckets read in one pipelined round trip when clearing a type.
CLEAR_SPAN = 256


async def type_members(
    store: TaskStore, keys: Keys, partition: int, task_type: str, buckets: range
) -> list[tuple[str, int]]:
    """Every (task id, bucket) in these buckets of a type's index."""
    return await index_members(
        store.client, lambda b: keys.by_type(partition, task_type, b), buckets
    )


async def count_by_status(store: TaskStore, buckets_per_call: int = 256) -> dict[str, int]:
    """Tasks per status, reading every state record (one ``HVALS`` a bucket, pipelined,
    yielding to other tasks between calls): seconds at a million tasks, so for a gauge
    refreshed every few minutes, never per request. Records this version cannot read
    are counted as ``unreadable``; a state bucket Redis will not read (a key of another
    kind, a permission missing) holds tasks no one can count, and is named in a warning
    (``task_count_incomplete``, with Redis's reply) each count it is left out of."""
    keys = await store.keys()
    counts = dict.fromkeys([*STATUSES, "unreadable"], 0)
    left_out: list[str] = []
    error = ""
    for partition in range(keys.partitions):
        for start in range(0, keys.buckets, buckets_per_call):
            stop = min(start + buckets_per_call, keys.buckets)
            replies = await store.client.pipeline(
                [("HVALS", keys.states(partition, b)) for b in range(start, stop)]
            )
            for bucket, values in enumerate(replies, start):
                if not isinstance(values, list):
                    left_out.append(keys.states(partition, bucket))
                    error = error or reply_text(values)
                    continue
                for raw in values:
                    index = status_index(raw)
                    counts[STATUSES[index] if index is not None else "unreadable"] += 1
            await trio.lowlevel.checkpoint()
    if left_out:
        get_logger(actor="store").warning(
            "task_count_incomplete", buckets=len(left_out), keys=left_out[:10], error=error,
            fix="Redis would not read these state buckets (the error says why): mend the "
            "permission, or restore a key of another kind from a backup",
        )  # fmt: skip
    return counts


async def delete_type(store: TaskStore, task_type: str) -> int:
    """Delete every task of a type, ``CLEAR_BATCH`` ids per script call; how many."""
    keys = await store.keys()
    check_name("type", task_type)
    deleted = 0
    for partition in range(keys.partitions):
        for start in range(0, keys.buckets, CLEAR_SPAN):
            buckets = range(start, min(start + CLEAR_SPAN, keys.buckets))
            members = await type_members(store, keys, partition, task_type, buckets)
            for i in range(0, len(members), CLEAR_BATCH):
                batch = [task_id for task_id, _ in members[i : i + CLEAR_BATCH]]
                deleted += await (await store.scripts()).delete_tasks(batch, task_type)
    return deleted
