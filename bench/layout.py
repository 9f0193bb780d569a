"""``python -m bench layout [N]``: Redis bytes per task (``used_memory`` from an empty
server, divided by N) of this version's layout against the one before it.

Every variant stores N tasks with server-generated ids, type ``email``, payload
``{"to": "a@example.com"}`` and a 60 s interval schedule first due in a day, 16 partitions:

- ``layout_1``: the previous layout (a hash per task with every field, the schedule zset,
  a set of ids per type), written with plain commands as Metronome 1 wrote it, with its
  20-hex ids;
- ``layout_2``: this version, written by ``TaskStore.create_many`` (two compact records in
  bucket hashes, the schedule zset, the bucketed type index), default buckets (1024 per
  partition);
- ``layout_2_after_a_run``: the same after every task's run is recorded (counters, last run
  time and status, one history entry);
- ``layout_2_full_history``: the same after 20 runs of every task are recorded: its
  history ring full at the default ``[scheduler] history`` (the whole record as it stays
  once a task has run that often);
- ``layout_2_sized``: buckets sized for N (``N / (16 * 64)``), as docs/PERFORMANCE.md
  advises for a namespace far from a million tasks; at N = 1,000,000 it is the default.
"""

from __future__ import annotations

import argparse
import secrets
import zlib
from typing import Any

import redis
import trio

from actors.domain.model import TaskSpec
from actors.domain.schedules import Schedule
from actors.store.history import DEFAULT_HISTORY, Ledger
from actors.store.keys import DEFAULT_BUCKETS
from actors.store.replies import OutcomeWrite
from actors.store.tasks import TaskStore
from runtime.config import RedisSection
from runtime.redis_io import RedisClient

PAYLOAD = {"to": "a@example.com"}
PARTITIONS = 16
#: How long connections idle before a memory reading.
SETTLE_S = 2.0
#: The target fill of a bucket when sized for N (listpack up to 128).
FILL = 64


#: Every variant, in the order they run.
VARIANTS = ("layout_1", "layout_2", "layout_2_after_a_run", "layout_2_full_history",
            "layout_2_sized")  # fmt: skip


def variants(text: str) -> tuple[str, ...]:
    """``layout --only``: a comma-separated list of known variants (argparse's ``type``)."""
    only = tuple(v.strip() for v in text.split(",") if v.strip())
    unknown = sorted(set(only) - set(VARIANTS))
    if unknown or not only:
        raise argparse.ArgumentTypeError(
            f"unknown variants {unknown}; known: {', '.join(VARIANTS)}"
        )
    return only


def run(url: str, n: int, only: tuple[str, ...] = VARIANTS) -> dict[str, Any]:
    """The variants in ``only`` (``variants``; all by default: at ten million tasks the runs
    of every task recorded twenty times take hours on two cores, so such a size asks for a
    few)."""
    client = redis.Redis.from_url(url, socket_timeout=300)
    try:
        client.flushall()
        # What a first use allocates once and keeps (loaded scripts, which FLUSHALL keeps,
        # and the server's own first-use structures: ~150 KB) is not a task's: a warm-up
        # run pays for it before any base is read.
        trio.run(_layout_2, client, url, min(n, 1000), DEFAULT_BUCKETS, 1)
        client.flushall()
        figures: dict[str, Any] = {}
        if "layout_1" in only:
            figures["layout_1"] = _layout_1(client, n)
        sized = max(1, n // (PARTITIONS * FILL))
        for name, buckets, after_run in (
            ("layout_2", DEFAULT_BUCKETS, 0),
            ("layout_2_after_a_run", DEFAULT_BUCKETS, 1),
            ("layout_2_full_history", DEFAULT_BUCKETS, DEFAULT_HISTORY),
            ("layout_2_sized", sized, 0),
        ):
            if name in only:
                used = trio.run(_layout_2, client, url, n, buckets, after_run)
                figures[name] = round(used / n)
                client.flushall()
        figures["sized_buckets"] = sized
        return figures
    finally:
        client.close()


def _layout_1(client: redis.Redis, n: int) -> int:
    base = int(client.info("memory")["used_memory"])
    pipe = client.pipeline(transaction=False)
    for i in range(n):
        task_id = secrets.token_hex(10)
        tag = f"{{metronome:{zlib.crc32(task_id.encode()) % PARTITIONS}}}"
        pipe.hset(f"{tag}:task:{task_id}", mapping={
            "type": "email", "payload": '{"to":"a@example.com"}',
            "sched": '{"every_s":60.0,"kind":"interval"}', "status": "active",
            "created_ms": 1_796_025_522_080, "next_ms": 1_796_111_922_080 + i,
        })  # fmt: skip
        pipe.zadd(f"{tag}:schedule", {task_id: 1_796_111_922_080 + i})
        pipe.sadd(f"{tag}:type:email", task_id)
        if i % 5000 == 4999:
            pipe.execute()
    pipe.execute()
    used = int(client.info("memory")["used_memory"]) - base
    client.flushall()
    return round(used / n)


async def _layout_2(probe: redis.Redis, url: str, n: int, buckets: int, runs: int) -> int:
    """Bytes used by the n tasks after ``runs`` runs each, measured while the store's
    connections are open and idle
    (a connection's buffers are Redis memory too; Redis shrinks an idle connection's query
    buffer within a second or two, so both readings wait for that)."""
    client = RedisClient.from_settings(url, RedisSection(url=url))
    try:
        store = TaskStore(client, "metronome", PARTITIONS, buckets)
        await store.keys()
        await trio.sleep(SETTLE_S)
        base = int(probe.info("memory")["used_memory"])
        start = await store.now_ms() + 86_400_000
        schedule = Schedule("interval", every_s=60, start_ms=start)
        ids: list[str] = []
        for offset in range(0, n, 5000):
            specs = [TaskSpec("email", schedule, PAYLOAD) for _ in range(min(5000, n - offset))]
            ids += [c.task_id for c in await store.create_many(specs)]
        for run in range(runs):
            await _record_runs(store, ids, start + run * 60_000)
        await trio.sleep(SETTLE_S)
        return int(probe.info("memory")["used_memory"]) - base
    finally:
        await client.aclose()


async def _record_runs(store: TaskStore, ids: list[str], due_ms: int) -> None:
    """Record an ok run for every task, due at ``due_ms``, started 12 ms and finished 30 ms
    later on node 1 (as consumers do, through record_outcomes.lua)."""
    scripts = await store.scripts()
    ledger = Ledger(DEFAULT_HISTORY, 1, 60_000)
    for i in range(0, len(ids), 5000):
        await scripts.record_outcomes(
            [OutcomeWrite(t, 0, due_ms + 30, "", due_ms, due_ms + 12) for t in ids[i : i + 5000]],
            "email",
            ledger,
        )
