"""A catch-up window judged against a task's jitter and spread, against a real Redis and
a poller: a fire is late only past the latest its task placed it by design."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from actors.config import ConsumerSection
from actors.domain.model import TaskSpec
from actors.domain.schedules import Schedule
from actors.scheduling.poller import Poller, PollerSettings
from actors.store.flights import parse_policy, task_policy_code
from actors.store.keys import GROUP
from actors.store.tasks import TaskStore
from runtime.logging import get_logger
from runtime.redis_io import RedisClient
from tests.execution_harness import node_config, records, running_node, wait_until
from tests.test_poller import stream_fires


def test_a_fire_is_late_only_past_its_jitter_and_spread() -> None:
    """The window counts from the grid time moved by the spread and the jitter's bound."""
    grid = 1_800_000_000_000
    jittered = Schedule("interval", every_s=60, jitter_s=30, catchup_window_s=10)
    policy = parse_policy(task_policy_code(jittered, "t1"))
    assert not policy.expired(grid, grid + 39_000)
    assert policy.expired(grid, grid + 41_000)
    spread = Schedule("interval", every_s=60, spread_s=20, catchup_window_s=10)
    offset = spread.offset_ms("t1")
    policy = parse_policy(task_policy_code(spread, "t1"))
    assert not policy.expired(grid, grid + offset + 9_000)
    assert policy.expired(grid, grid + offset + 11_000)


async def test_a_fire_its_jitter_placed_past_the_window_still_runs(
    redis_client: RedisClient, namespace: str
) -> None:
    """A once task due 1.5 s ago, with a jitter of up to 3 s and a catch-up window of 1 s:
    its claim comes 1.5 to 3 s after the grid time, on time for its jitter, and it is
    enqueued, not dropped as expired."""
    store = TaskStore(redis_client, namespace, default_partitions=1)
    at = await store.now_ms() - 1500
    await store.create(
        TaskSpec("t", Schedule("once", at_ms=at, jitter_s=3, catchup_window_s=1), task_id="x")
    )
    poller = Poller(store, PollerSettings())
    enqueued = 0
    with trio.move_on_after(30):
        while not enqueued:
            enqueued = (await poller.tick(await store.scripts(), [0], get_logger())).enqueued
            await trio.sleep(0.05)
    assert [int(f["due_ms"]) for f in await stream_fires(store, "t")] == [at]


async def test_a_fire_started_on_time_and_taken_over_later_runs_again(
    redis_client: RedisClient, redis_url: str, namespace: str, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """A fire of a task with a one-second catch-up window is read on time by a consumer
    that dies with it; a node's claimer takes it over a lease later, past the window. It
    may have started there: it runs again (at least once), never dropped as expired."""
    record = tmp_path / "ran.jsonl"
    monkeypatch.setenv("METRONOME_TEST_RECORD", str(record))
    store = TaskStore(redis_client, namespace, default_partitions=4)
    later = await store.now_ms() + 3_600_000  # its poller fires nothing meanwhile
    windowed = Schedule("interval", every_s=3600, start_ms=later, catchup_window_s=1)
    await store.create(TaskSpec("work", windowed, task_id="w"))
    task = await store.get("w")
    assert task is not None
    keys = await store.keys()
    stream = keys.queue("work")
    await redis_client.execute("XGROUP", "CREATE", stream, GROUP, "0", "MKSTREAM")
    due = await store.now_ms()
    await redis_client.execute(
        "XADD", stream, "*", "task_id", "w", "payload", "null", "attempt", "0",
        "due_ms", str(due), "o", task_policy_code(windowed, "w", task.created_ms),
    )  # fmt: skip
    await redis_client.execute(  # read on time by a consumer that then died
        "XREADGROUP", "GROUP", GROUP, "gone", "COUNT", 1, "STREAMS", stream, ">"
    )
    consumers = {"work": ConsumerSection("tests.handlers.jobs:noop", lease_s=1.5)}

    async def ran() -> bool:
        return bool(records(record))

    async with running_node(node_config(redis_url, namespace, tmp_path, consumers)):
        await wait_until(ran)
    assert [(r["task_id"], r["due_ms"]) for r in records(record)] == [("w", due)]
