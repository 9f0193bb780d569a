"""An update whose schedule keeps the task's grid (a bound, a policy, the jitter or the
spread changed) keeps the task's next grid time, fire count and status, against a real
Redis and a real poller tick: a finished one-shot does not fire again, an interval keeps
its phase, ``max_runs`` counts on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from actors.config import ConsumerSection
from actors.domain.model import TaskSpec
from actors.domain.schedules import Schedule
from actors.scheduling.poller import Poller, PollerSettings
from actors.store.action_scripts import BatchItem
from actors.store.codes import Code
from actors.store.placement import resume_point
from actors.store.tasks import TaskStore
from runtime.logging import get_logger
from runtime.redis_io import RedisClient
from tests.execution_harness import node_config, running_node, wait_until
from tests.test_poller import stream_fires

HOUR = 3_600_000


class _Ticks:
    """One poller's ticks over the one partition (a second poller would find it held)."""

    def __init__(self, store: TaskStore) -> None:
        self.store = store
        self.poller = Poller(store, PollerSettings())

    async def __call__(self) -> int:
        """The fires one tick enqueued."""
        scripts = await self.store.scripts()
        return (await self.poller.tick(scripts, [0], get_logger())).enqueued


@pytest.fixture
def store(redis_client: RedisClient, namespace: str) -> TaskStore:
    return TaskStore(redis_client, namespace, default_partitions=1)


async def _one_shot(store: TaskStore) -> Schedule:
    """Task ``o`` (type ``t``), a one-shot due a second ago."""
    once = Schedule("once", at_ms=await store.now_ms() - 1000)
    await store.create(TaskSpec("t", once, task_id="o"))
    return once


async def _task(store: TaskStore, task_id: str) -> tuple[str, int | None, int]:
    task = await store.get(task_id)
    assert task is not None
    return task.status, task.next_run_ms, task.fires


async def test_a_finished_one_shot_updated_on_its_grid_does_not_fire_again(
    store: TaskStore,
) -> None:
    _tick = _Ticks(store)
    once = await _one_shot(store)
    assert once.at_ms is not None
    at = once.at_ms
    assert await _tick() == 1
    assert await _task(store, "o") == ("finished", None, 1)
    for changed in (
        attrs.evolve(once, jitter_s=2),
        attrs.evolve(once, misfire="skip", overlap="skip"),
        attrs.evolve(once, end_ms=at + HOUR, max_runs=5),
    ):
        assert await store.update("o", schedule=changed) == "finished"
        assert await _tick() == 0
    assert len(await stream_fires(store, "t")) == 1
    assert await _task(store, "o") == ("finished", None, 1)
    # Another grid (a new time) is a new schedule: it fires, counted from 0.
    again = Schedule("once", at_ms=await store.now_ms() - 500)
    assert await store.update("o", schedule=again) == "active"
    assert await _tick() == 1
    assert await _task(store, "o") == ("finished", None, 1)


async def test_an_interval_keeps_its_phase_and_counts_on_against_max_runs(
    store: TaskStore,
) -> None:
    _tick = _Ticks(store)
    start = await store.now_ms() - 10
    hourly = Schedule("interval", every_s=3600, start_ms=start, max_runs=3)
    assert hourly.start_ms is not None
    await store.create(TaskSpec("t", hourly, task_id="i"))
    assert await _tick() == 1
    assert await _task(store, "i") == ("active", start + HOUR, 1)
    # The jitter and the spread move when it is enqueued, not the grid time or the count.
    await store.update("i", schedule=attrs.evolve(hourly, jitter_s=1, spread_s=60))
    assert await _task(store, "i") == ("active", start + HOUR, 1)
    assert await _tick() == 0  # its grid time was not placed at once again
    # A pause keeps its grid time through an update too.
    await store.pause("i")
    assert await store.update("i", schedule=attrs.evolve(hourly, jitter_s=2)) == "paused"
    assert await _task(store, "i") == ("paused", start + HOUR, 1)
    await store.resume("i")
    # Runs spent under the new max_runs, or a new end before the next grid time: finished.
    assert await store.update("i", schedule=attrs.evolve(hourly, max_runs=1)) == "finished"
    assert await _task(store, "i") == ("finished", None, 1)
    # Given more, it goes on at its grid's next time, its fire still counted.
    assert await store.update("i", schedule=attrs.evolve(hourly, max_runs=2)) == "active"
    assert await _task(store, "i") == ("active", start + HOUR, 1)
    assert await store.update("i", schedule=attrs.evolve(hourly, end_ms=start + 60)) == ("finished")
    assert await store.update("i", schedule=attrs.evolve(hourly, end_ms=start + 2 * HOUR)) == (
        "active"
    )
    assert await _task(store, "i") == ("active", start + HOUR, 1)
    assert len(await stream_fires(store, "t")) == 1
    # Another interval is another grid: placed anew, counted from 0.
    await store.update("i", schedule=Schedule("interval", every_s=60, start_ms=start + HOUR))
    assert await _task(store, "i") == ("active", start + HOUR, 0)


async def test_a_one_shot_that_never_fired_fires_once_its_bounds_let_it(
    store: TaskStore,
) -> None:
    """An end before its time finishes a one-shot unfired; the end taken back, it fires
    (once: a one-shot that fired stays finished)."""
    _tick = _Ticks(store)
    once = await _one_shot(store)
    assert once.at_ms is not None
    at = once.at_ms
    assert await store.update("o", schedule=attrs.evolve(once, end_ms=at - 1)) == "finished"
    assert await _tick() == 0
    assert await store.update("o", schedule=once) == "active"
    assert await _tick() == 1
    assert await _task(store, "o") == ("finished", None, 1)
    assert await store.update("o", schedule=attrs.evolve(once, max_runs=3)) == "finished"
    assert await _tick() == 0


async def test_a_finished_interval_given_room_goes_on_on_the_grid_it_fired_on(
    redis_client: RedisClient, redis_url: str, namespace: str, tmp_path: Path
) -> None:
    """An interval without ``start_ms`` keeps no grid time once finished: given more
    runs, it goes on on the grid its history shows (its fire ran), not one from the
    update's time."""
    store = TaskStore(redis_client, namespace)
    every = Schedule("interval", every_s=3600, max_runs=1)
    await store.create(TaskSpec("work", every, {"sleep_s": 0}, "i"))
    consumers = {"work": ConsumerSection("tests.handlers.jobs:sleepy")}

    async def finished_and_run() -> bool:
        task = await store.get("i")
        return task is not None and task.status == "finished" and task.last_fate == "ok"

    async with running_node(node_config(redis_url, namespace, tmp_path, consumers)):
        await wait_until(finished_and_run)
    (fired,) = [int(f["due_ms"]) for f in await stream_fires(store, "work")]
    await trio.sleep(0.01)  # the update's time is not the grid's
    await store.update("i", schedule=attrs.evolve(every, max_runs=2))
    assert await _task(store, "i") == ("active", fired + HOUR, 1)


async def test_an_update_placed_from_a_schedule_replaced_meanwhile_is_placed_again(
    store: TaskStore,
) -> None:
    """Two updates of a finished one-shot at once, each on its grid: the one placed from
    the schedule the other replaced is read and placed again, not placed as a new grid
    (which fired the one-shot a second time)."""
    _tick = _Ticks(store)
    once = await _one_shot(store)
    assert await _tick() == 1
    get = store._definition_and_state
    raced: list[str] = []

    async def read_then_another_update(task_id: str) -> Any:
        task = await get(task_id)
        if not raced:  # the other update lands between this one's read and its script
            raced.append("reading")
            raced.append(await store.update(task_id, schedule=attrs.evolve(once, jitter_s=1)))
        return task

    store._definition_and_state = read_then_another_update  # type: ignore[method-assign]
    assert await store.update("o", schedule=attrs.evolve(once, misfire="skip")) == "finished"
    assert raced == ["reading", "finished"]
    assert await _tick() == 0
    assert await _task(store, "o") == ("finished", None, 1)


async def test_a_claim_in_flight_keeps_its_time_and_counts_it_through_an_update(
    store: TaskStore,
) -> None:
    """An update on the grid lands between a claim's decision (skip) and its commit, and
    another before the next claim: the grid time the claim put in flight stays the task's
    next, is counted once, and the grid goes on after it (not revived past it, its fire
    uncounted)."""
    start = await store.now_ms() - 10
    hourly = Schedule("interval", every_s=3600, start_ms=start, overlap="skip", max_runs=5)
    await store.create(TaskSpec("t", hourly, task_id="c"))
    poller = Poller(store, PollerSettings())
    commit = poller._enqueue_and_commit

    async def update_then_commit(*args: Any) -> Any:
        await store.update("c", schedule=attrs.evolve(hourly, misfire="fire_all"))
        return await commit(*args)

    poller._enqueue_and_commit = update_then_commit  # type: ignore[method-assign,assignment]
    scripts = await store.scripts()
    assert (await poller.tick(scripts, [0], get_logger())).enqueued == 1
    poller._enqueue_and_commit = commit  # type: ignore[method-assign]
    # Another update before the next claim (the refused commit confirmed the fire).
    await store.update("c", schedule=attrs.evolve(hourly, misfire_cap=50))
    await poller.tick(scripts, [0], get_logger())  # the claim's time again: found appended
    assert await _task(store, "c") == ("active", start + HOUR, 1)
    assert [int(f["due_ms"]) for f in await stream_fires(store, "t")] == [start]


async def test_an_update_reads_only_what_it_places_from(store: TaskStore) -> None:
    """A task whose run record cannot be read (a hand edit, a partial restore) is still
    updated on its grid: the update reads its definition and state alone."""
    _tick = _Ticks(store)
    once = await _one_shot(store)
    assert await _tick() == 1
    keys = await store.keys()
    runs = keys.runs(keys.partition_of("o"), keys.bucket_of("o"))
    await store.client.execute("HSET", runs, "o", b"\xc1 not a run record")
    assert await store.update("o", schedule=attrs.evolve(once, jitter_s=1)) == "finished"


async def _resume_read_then_updated(store: TaskStore) -> tuple[int, tuple[int, int, int]]:
    """Task ``r``, every minute, paused; a resume's placement read from it (next time,
    score, version); then an update gives it a daily grid from 7 h on. Now, and that."""
    now = await store.now_ms()
    minutely = Schedule("interval", every_s=60, start_ms=now - 1)
    await store.create(TaskSpec("t", minutely, task_id="r"))
    assert await store.pause("r") == "paused"
    paused = await store.get("r")
    assert paused is not None
    stale, score = resume_point(paused, await store.now_ms())
    assert stale is not None and score is not None
    daily = Schedule("interval", every_s=86_400, start_ms=now + 7 * HOUR)
    assert await store.update("r", schedule=daily) == "paused"
    return now, (stale, score, paused.updated_ms)


async def test_a_resume_placed_from_a_schedule_an_update_replaced_is_placed_again(
    store: TaskStore,
) -> None:
    """A resume reads a paused task and places its next time on its grid; an update gives
    it another schedule before the resume's write: the write is refused (nothing done)
    and the resume reads and places it again, on the new grid."""
    now, (stale, score, version) = await _resume_read_then_updated(store)
    scripts = await store.scripts()
    code, status, _, _ = await scripts.set_status("r", "resume", stale, score, version=version)
    assert (code, status) == (Code.CONFLICT, "paused")
    assert await store.resume("r") == "active"
    assert await _task(store, "r") == ("active", now + 7 * HOUR, 0)


async def test_a_bulk_resume_of_a_task_an_update_changed_since_its_read_fails_it(
    store: TaskStore,
) -> None:
    """A bulk resume's batch placed from a read an update has replaced since: the task is
    not resumed on the old grid; it is counted failed, and why, to be resumed again."""
    now, (stale, score, version) = await _resume_read_then_updated(store)
    scripts = await store.scripts()
    item = BatchItem("r", stale, score, version=version)
    reply = await scripts.action_batch(
        0, "act-1", "resume", "", [item], final=True, note="", retention_ms=60_000,
        max_failures=10,
    )  # fmt: skip
    assert [(code, reason) for code, reason, _ in reply.results] == [
        (-1, "changed since it was read: resume it again")
    ]
    assert await _task(store, "r") == ("paused", now + 7 * HOUR, 0)  # as the update left it
