"""A catch-up window judged against a task's jitter and spread, against a real Redis and
a poller: a fire is late only past the latest its task placed it by design."""

from __future__ import annotations

import trio

from actors.domain.model import TaskSpec
from actors.domain.schedules import Schedule
from actors.scheduling.poller import Poller, PollerSettings
from actors.store.flights import parse_policy, task_policy_code
from actors.store.tasks import TaskStore
from runtime.logging import get_logger
from runtime.redis_io import RedisClient
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
