"""``metronome migrate``: convert a namespace written by an older Metronome to this
version's Redis layout, in place, with every node of the namespace stopped.

Layout 1 (before this version) kept a hash per task (``{ns:P}:task:<id>``) and a set of ids
per type (``{ns:P}:type:<type>``); layout 2 keeps each task as two records in bucket
hashes (``actors.store.records``). The schedule zset, queues, retries and dead letters are the
same in both and are not touched.

Tasks move in batches of ``batch`` per script call (each call a few milliseconds), each
task whole: written in the new layout and its old hash deleted in one script. The meta
key says layout 2 only when every task has moved, so a node refuses the namespace until
then, and an interrupted migration picks up where it stopped when run again. A stored
task this version cannot read stops the migration with its key named; nothing of its
batch is written, nothing is lost.
"""

from __future__ import annotations

import json

import cattrs

from actors.domain.errors import LayoutMismatch
from actors.domain.model import converter
from actors.domain.schedules import Schedule
from actors.store.keys import DEFAULT_BUCKETS, LAYOUT_VERSION, Keys
from actors.store.records import encode_definition, encode_schedule, encode_state
from actors.store.scripts import Scripts
from runtime.redis_io import RedisClient


async def migrate(
    client: RedisClient, namespace: str, *, buckets: int = DEFAULT_BUCKETS, batch: int = 500
) -> int:
    """Migrate ``namespace`` to the current layout; returns the number of tasks moved
    (0 when it is already current). Raises LayoutMismatch when there is nothing this
    version knows how to migrate (no namespace, or a newer layout)."""
    meta = f"{namespace}:meta"
    layout, partitions = await client.execute("HMGET", meta, "layout", "partitions")
    if layout is None or partitions is None:
        raise LayoutMismatch(f"namespace {namespace!r} does not exist (no {meta} key)")
    if int(layout) == LAYOUT_VERSION:
        return 0
    if int(layout) != 1:
        raise LayoutMismatch(
            f"namespace {namespace!r} has layout version {int(layout)}; this Metronome "
            f"migrates version 1 to {LAYOUT_VERSION}"
        )
    await client.execute("HSETNX", meta, "buckets", buckets)
    keys = Keys(namespace, int(partitions), int(await client.execute("HGET", meta, "buckets")))
    moved = 0
    for task_type in sorted(t.decode() for t in await client.execute("SMEMBERS", keys.types)):
        for partition in range(keys.partitions):
            moved += await _migrate_set(client, keys, partition, task_type, batch)
    await client.execute("HSET", meta, "layout", LAYOUT_VERSION)
    return moved


async def _migrate_set(
    client: RedisClient, keys: Keys, partition: int, task_type: str, batch: int
) -> int:
    tag = keys.tag(partition)
    type_set = f"{tag}:type:{task_type}"
    moved = 0
    while ids := [i.decode() for i in await client.execute("SRANDMEMBER", type_set, batch)]:
        old_keys = [f"{tag}:task:{i}" for i in ids]
        hashes = await client.pipeline([("HGETALL", key) for key in old_keys])
        rows = [
            (task_id, _convert(key, fields) if fields else ["", "", ""])
            for task_id, key, fields in zip(ids, old_keys, hashes, strict=True)
        ]
        moved += await Scripts(client, keys).migrate_tasks(partition, type_set, task_type, rows)
    return moved


def _convert(key: str, fields: dict[bytes, bytes]) -> list[bytes | str]:
    """A layout-1 task hash as (definition, state, last error)."""
    f = {k.decode(): v.decode() for k, v in fields.items()}
    try:
        schedule = converter.structure(json.loads(f["sched"]), Schedule)
        json.loads(f["payload"])  # a payload that is not JSON would break every reader
        created = int(f["created_ms"])

        def number(name: str) -> int | None:
            return int(f[name]) if name in f else None

        definition = encode_definition(f["type"], f["payload"], encode_schedule(schedule), created)
        state = encode_state(
            f["status"], number("next_ms"), number("fires") or 0, number("updated_ms"),
            number("runs") or 0, number("retries") or 0, number("last_run_ms"),
            f.get("last_status"), f.get("claim"),
        )  # fmt: skip
    except (KeyError, ValueError, TypeError, cattrs.BaseValidationError) as exc:
        raise LayoutMismatch(
            f"{key}: not a task Metronome 1 wrote ({exc!r}); nothing of its batch was "
            "changed: fix or delete that key and run the migration again"
        ) from exc
    return [definition, state, f.get("last_error", "")]
