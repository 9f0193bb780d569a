"""``python -m bench layout [N]``: Redis bytes per task for the current key layout and for
leaner variants, written with plain commands (no Metronome code), to show what a layout
change could save before anyone builds it.

Variants, each N tasks with server-style 20-hex ids, 16 partitions, an interval schedule
and a small payload: the current layout (task hash + schedule ZSet entry + per-type set
entry); without the per-type set; the hash alone; short field names without ``status``;
plus schedules interned (the hash holds a 4-character reference); and that without the
per-type set; and records packed ~100 to a bucket hash (field = task id, value = one
compact string under Redis's 64-byte listpack limit), with the ZSet and type set, and
without the type set: the layout-v2 idea, measured before it is built; and buckets of
today's full records, whose values pass the 64-byte listpack limit, with the server's
default and with ``hash-max-listpack-value`` 256; and compact buckets with the type index
bucketed too (small hashes instead of a set).
"""

from __future__ import annotations

import secrets
import zlib
from collections.abc import Callable

import redis
from redis.client import Pipeline

PAYLOAD = '{"to":"a@example.com"}'
SCHED = '{"every_s":60.0,"kind":"interval"}'
T0 = 1_796_025_522_080


def _full(i: int) -> dict[str, str | int]:
    return {"type": "email", "payload": PAYLOAD, "sched": SCHED, "status": "active",
            "created_ms": T0, "next_ms": T0 + i}  # fmt: skip


def _short(i: int) -> dict[str, str | int]:
    return {"t": "email", "p": PAYLOAD, "s": SCHED, "c": T0, "n": T0 + i}


def _interned(i: int) -> dict[str, str | int]:
    return {"t": "email", "p": PAYLOAD, "s": "3f2a", "c": T0, "n": T0 + i}


VARIANTS: list[tuple[str, Callable[[int], dict[str, str | int]], bool, bool]] = [
    ("current", _full, True, True),
    ("no_type_set", _full, True, False),
    ("hash_only", _full, False, False),
    ("short_fields_no_status", _short, True, True),
    ("short_fields_interned_schedule", _interned, True, True),
    ("short_interned_no_type_set", _interned, True, False),
]

#: Tasks per bucket hash: under Redis's default hash-max-listpack-entries (128).
PER_BUCKET = 100


def run(url: str, n: int) -> dict[str, int]:
    client = redis.Redis.from_url(url)
    try:
        figures = {name: _bytes_per_task(client, n, fields, zset, typeset)
                   for name, fields, zset, typeset in VARIANTS}  # fmt: skip
        figures["bucketed"] = _bucketed(client, n, typeset=True)
        figures["bucketed_no_type_set"] = _bucketed(client, n, typeset=False)
        figures["bucketed_bucketed_type_index"] = _bucketed(
            client, n, typeset=False, type_buckets=True
        )
        # The same with today's full record (every field, schedule JSON not interned): its
        # values exceed the 64-byte listpack limit, so buckets become hash tables unless
        # the server allows longer listpack values (CONFIG SET, restored after).
        figures["bucketed_full_no_type_set"] = _bucketed(client, n, typeset=False, full=True)
        limit = str(client.config_get("hash-max-listpack-value")["hash-max-listpack-value"])
        client.config_set("hash-max-listpack-value", 256)
        try:
            figures["bucketed_full_no_type_set_listpack_256"] = _bucketed(
                client, n, typeset=False, full=True
            )
        finally:
            client.config_set("hash-max-listpack-value", limit)
        return figures
    finally:
        client.close()


def _bucketed(
    client: redis.Redis, n: int, *, typeset: bool, full: bool = False, type_buckets: bool = False
) -> int:
    buckets = max(1, n // PER_BUCKET)

    def write(pipe: Pipeline, i: int, task_id: str) -> None:
        slot = zlib.crc32(task_id.encode()) % buckets
        tag = f"{{metronome:{slot % 16}}}"
        record = "\x1f".join(str(v) for v in (_full(i) if full else _interned(i)).values())
        pipe.hset(f"{tag}:tasks:{slot}", task_id, record)
        pipe.zadd(f"{tag}:schedule", {task_id: T0 + i})
        if typeset:
            pipe.sadd(f"{tag}:type:email", task_id)
        if type_buckets:  # the type index as small hashes, listpack-encoded
            pipe.hset(f"{tag}:type:email:{slot}", task_id, "")

    return _measure(client, n, write)


def _bytes_per_task(
    client: redis.Redis, n: int, fields: Callable[[int], dict[str, str | int]], zset: bool,
    typeset: bool,
) -> int:  # fmt: skip
    def write(pipe: Pipeline, i: int, task_id: str) -> None:
        tag = f"{{metronome:{zlib.crc32(task_id.encode()) % 16}}}"
        pipe.hset(f"{tag}:task:{task_id}", mapping=fields(i))  # type: ignore[arg-type]
        if zset:
            pipe.zadd(f"{tag}:schedule", {task_id: T0 + i})
        if typeset:
            pipe.sadd(f"{tag}:type:email", task_id)

    return _measure(client, n, write)


def _measure(client: redis.Redis, n: int, write: Callable[[Pipeline, int, str], None]) -> int:
    """Bytes of ``used_memory`` per task after ``write`` stored n tasks (from empty)."""
    client.flushall()
    base = int(client.info("memory")["used_memory"])
    pipe = client.pipeline(transaction=False)
    for i in range(n):
        write(pipe, i, secrets.token_hex(10))
        if i % 5000 == 4999:
            pipe.execute()
    pipe.execute()
    used = int(client.info("memory")["used_memory"]) - base
    client.flushall()
    return round(used / n)
