"""A partition whose outcome writes Redis rejects (a key of another kind in it, a record
no script can read) holds back its own fires' completion only: the consumer writes and
acknowledges every other partition's fires meanwhile, keeps the held ones pending (their
leases renewed, never run again), and completes them once the key is mended."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio
from redis.exceptions import ResponseError

from actors.config import ConsumerSection
from actors.execution.completion import Outcome
from actors.execution.flight import Flight
from actors.store.keys import GROUP
from actors.store.messages import Message
from actors.store.tasks import TaskStore
from runtime.redis_io import RedisClient
from tests.execution_harness import node_config, periodic_tasks, records, running_node, wait_until

LogLines = Callable[[], list[dict[str, Any]]]


async def _true(value: bool) -> bool:
    return value


async def _pending_ids(store: TaskStore, task_type: str) -> set[str]:
    keys = await store.keys()
    entries = await store.client.execute_unparsed(
        "XPENDING", keys.queue(task_type), GROUP, "-", "+", 1000
    )
    return {e[0].decode() for e in entries}


async def test_a_partition_whose_outcomes_are_rejected_holds_back_its_own_fires_only(
    redis_client: RedisClient, redis_url: str, namespace: str, tmp_path: Path, record: Path,
    log_lines: LogLines,
) -> None:  # fmt: skip
    """Partition P's history key holds a string: every outcome write there fails with
    WRONGTYPE. The other partitions' fires keep being written and acknowledged (their
    tasks' run counts go on); P's fires ran once each and stay pending, said in one
    ``completions_held_back`` line; once the key is removed they are written and
    acknowledged, each fire run once."""
    store = TaskStore(redis_client, namespace, default_partitions=4)
    section = ConsumerSection(handler="tests.handlers.jobs:noop", lease_s=3)
    config = node_config(redis_url, namespace, tmp_path, {"work": section})
    ids, _ = await periodic_tasks(store, count=12, every_s=0.5)
    keys = await store.keys()
    held = keys.partition_of(ids[0])
    held_ids = [t for t in ids if keys.partition_of(t) == held]
    others = [t for t in ids if keys.partition_of(t) != held]
    assert others
    await redis_client.execute("SET", keys.history(held), "not a hash")

    async def runs(task_id: str) -> int:
        task = await store.get(task_id)
        assert task is not None
        return task.runs

    async def others_completing() -> bool:
        return min([await runs(t) for t in others]) >= 6

    async with running_node(config):
        await wait_until(others_completing)
        # P's fires ran (once each) and wait, pending, for their outcomes
        ran = [r for r in records(record) if r["task_id"] in held_ids]
        assert len(ran) >= len(held_ids)
        with pytest.raises(ResponseError, match="WRONGTYPE"):
            await store.get(held_ids[0])
        assert len(await _pending_ids(store, "work")) >= len(held_ids)
        lines = [e for e in log_lines() if e["event"] == "completions_held_back"]
        assert lines and lines[0]["partition"] == held and "WRONGTYPE" in lines[0]["error"]
        await redis_client.execute("DEL", keys.history(held))

        async def settled() -> bool:
            return (
                not await _pending_ids(store, "work")
                and min([await runs(t) for t in held_ids]) >= 3
            )

        await wait_until(settled)
    assert [e for e in log_lines() if e["event"] == "completions_resumed"]
    counts = Counter(r["schedule_id"] for r in records(record))
    assert max(counts.values()) == 1, counts.most_common(3)
    assert not [e for e in log_lines() if e["event"] == "actor_crashed"]


async def test_a_held_back_fire_ends_the_wait_for_it_to_settle() -> None:
    """A suspect's turn waits for its fire to settle; a fire held back (its partition
    rejected) ran and survived, so the turn ends then, not once the partition is mended
    (the process's reads stay closed during a turn). It stays in flight until settled."""
    flight = Flight()
    message = Message("1-1", "t", "t:1", "work", "null", 0, 1, 1, None)
    flight.messages[message.msg_id] = message
    outcome = Outcome(message, 1, 2)
    async with trio.open_nursery() as nursery:
        ended = trio.Event()

        async def turn() -> None:
            await flight.until_settled(message.msg_id)
            ended.set()

        nursery.start_soon(turn)
        await trio.sleep(0.05)
        assert not ended.is_set()
        flight.held_back([outcome])
        with trio.fail_after(5):
            await ended.wait()
    assert message.msg_id in flight.messages  # renewed until its outcome is written
    with trio.fail_after(5):
        await flight.until_settled(message.msg_id)  # a turn that starts now waits not
    flight.settled([outcome])
    assert not flight.messages and not flight.held
