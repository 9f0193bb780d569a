"""``metronome migrate``: convert a namespace written by an older Metronome to this
version's Redis layout, in place, with every node of the namespace stopped.

Layout 1 kept a hash per task (``{ns:P}:task:<id>``) and a set of ids per type
(``{ns:P}:type:<type>``); layout 2 keeps each task as two records in bucket hashes
(``actors.store.records``). Layout 3 reads layout 2's records as they are (a task's run
counts stay in its state record until it next runs, then move to its run record), so 2 -> 3
only changes the number in the meta key; it still wants every node stopped, because a
layout-2 node's API writes are not counted where layout 3's commits look
(``commit_fires.lua``). The schedule zset, queues, retries and dead letters are the same in
all three and are not touched. Every migration, from a current layout too, ends by setting
the meta key's ``messages`` to 2: nodes of this version append compact stream messages from
their next start (``actors.store.messages``; older versions cannot read them, so this
step, the only one for a namespace already at layout 3, wants only that no older node
runs, not that every node is stopped).

Tasks move in batches of ``batch`` per script call (each call a few milliseconds), each
task whole: written in the new layout and its old hash deleted in one script. The meta
key says the new layout only when every task has moved, so a node refuses the namespace until
then, and an interrupted migration picks up where it stopped when run again. A stored
task this version cannot read stops the migration with its key named; nothing of its
batch is written, nothing is lost.
"""

from __future__ import annotations

import json
from typing import Any

import cattrs

from actors.domain.errors import LayoutMismatch
from actors.domain.model import converter
from actors.domain.schedules import Schedule
from actors.store.keys import COMPACT_MESSAGES, DEFAULT_BUCKETS, LAYOUT_VERSION, MIGRATES_FROM, Keys
from actors.store.records import (
    encode_definition,
    encode_schedule,
    encode_state,
    needs_rewrite,
    rewritten_definition,
)
from actors.store.scripts import Scripts
from runtime.redis_io import RedisClient

#: A process whose presence report (``ns:nodes``, ``actors.observability.presence``: one
#: every 5 s, shown as gone after 15 s) is newer than this is taken as still running.
LIVE_WITHIN_MS = 15_000


async def live_processes(client: RedisClient, namespace: str) -> list[str]:
    """The processes of the namespace's nodes that reported in within ``LIVE_WITHIN_MS``
    of Redis's clock (a report that cannot be read is left out)."""
    reports = await client.execute("HGETALL", f"{namespace}:nodes")
    now = await client.clock_ms()
    live = []
    for process, raw in (reports or {}).items():
        try:
            seen = int(json.loads(raw)["seen_ms"])
        except (ValueError, KeyError, TypeError):
            continue
        if now - seen < LIVE_WITHIN_MS:
            live.append(process.decode(errors="replace"))
    return sorted(live)


async def migrate(
    client: RedisClient, namespace: str, *, buckets: int = DEFAULT_BUCKETS, batch: int = 500,
    force: bool = False,
) -> int:  # fmt: skip
    """Migrate ``namespace`` to the current layout; returns the number of tasks moved or
    rewritten (0 when it is already current). Raises LayoutMismatch when there is nothing this
    version knows how to migrate (no namespace, or a newer layout), and, unless ``force``,
    when a node of the namespace still reports in (``live_processes``: at an older layout
    only an older node can, and what it writes while its tasks move is lost)."""
    meta = f"{namespace}:meta"
    layout, partitions = await client.execute("HMGET", meta, "layout", "partitions")
    if layout is None or partitions is None:
        raise LayoutMismatch(f"namespace {namespace!r} does not exist (no {meta} key)")
    if int(layout) == LAYOUT_VERSION:
        await client.execute("HSET", meta, "messages", COMPACT_MESSAGES)
        return 0
    if not force and (live := await live_processes(client, namespace)):
        shown = ", ".join(live[:5]) + (f" and {len(live) - 5} more" if len(live) > 5 else "")
        raise LayoutMismatch(
            f"namespace {namespace!r} has nodes still running ({shown} reported in within "
            f"{LIVE_WITHIN_MS // 1000} s): stop every node of the namespace, then migrate "
            "(--force if they are gone and their reports are not)"
        )
    if int(layout) == 2:  # records read as they are: only the number changes
        keys = Keys(namespace, int(partitions), int(await client.execute("HGET", meta, "buckets")))
        rewritten = await _rewrite_definitions(client, keys)
        await client.execute("HSET", meta, "layout", LAYOUT_VERSION, "messages", COMPACT_MESSAGES)
        return rewritten
    if int(layout) not in MIGRATES_FROM:
        raise LayoutMismatch(
            f"namespace {namespace!r} has layout version {int(layout)}; this Metronome "
            f"migrates versions {' and '.join(map(str, MIGRATES_FROM))} to {LAYOUT_VERSION}"
        )
    await client.execute("HSETNX", meta, "buckets", buckets)
    keys = Keys(namespace, int(partitions), int(await client.execute("HGET", meta, "buckets")))
    moved = 0
    for task_type in sorted(t.decode() for t in await client.execute("SMEMBERS", keys.types)):
        for partition in range(keys.partitions):
            moved += await _migrate_set(client, keys, partition, task_type, batch)
    await client.execute("HSET", meta, "layout", LAYOUT_VERSION, "messages", COMPACT_MESSAGES)
    return moved


async def _rewrite_definitions(client: RedisClient, keys: Keys, span: int = 256) -> int:
    """Rewrite the definitions the scripts cannot read (``records.needs_rewrite``: the
    1 -> 2 migration of an earlier version stored their schedules as MessagePack ``bin``);
    how many. Reads every definition bucket, ``span`` per round trip."""
    rewritten = 0
    for partition in range(keys.partitions):
        for start in range(0, keys.buckets, span):
            buckets = range(start, min(start + span, keys.buckets))
            replies = await client.pipeline(
                [("HGETALL", keys.definitions(partition, b)) for b in buckets]
            )
            writes: list[tuple[Any, ...]] = []
            for b, fields in zip(buckets, replies, strict=True):
                for task_id, raw in fields.items() if isinstance(fields, dict) else []:
                    if needs_rewrite(raw):
                        writes.append(
                            ("HSET", keys.definitions(partition, b), task_id,
                             rewritten_definition(raw))
                        )  # fmt: skip
            if writes:
                await client.pipeline(writes)
                rewritten += len(writes)
    return rewritten


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
