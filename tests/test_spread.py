"""Herd spreading and ``H`` against real Redis and real pollers: a task's index score is its
grid time plus its spread wherever a grid time is placed (create, update, resume, the
poller's commit), and the preview (``upcoming``) lists the fires the pollers enqueue."""

from __future__ import annotations

import pytest

from actors.domain.model import TaskSpec
from actors.domain.preview import upcoming
from actors.domain.schedules import Schedule
from actors.store.tasks import TaskStore
from runtime.redis_io import RedisClient
from tests.test_poller import run_pollers, stream_fires


@pytest.fixture
async def store(redis_client: RedisClient, namespace: str) -> TaskStore:
    return TaskStore(redis_client, namespace, default_partitions=4)


async def index_score(store: TaskStore, task_id: str) -> int | None:
    keys = await store.keys()
    score = await store.client.execute("ZSCORE", keys.schedule(keys.partition_of(task_id)), task_id)
    return None if score is None else int(float(score))


async def test_the_pollers_enqueue_the_fires_upcoming_lists_at_their_spread_times(
    store: TaskStore,
) -> None:
    start = await store.now_ms() + 300
    schedule = Schedule("interval", every_s=1, start_ms=start, spread_s=0.5)
    ids = [c.task_id for c in await store.create_many([TaskSpec("herd", schedule)] * 8)]
    planned = {}
    for task_id in ids:
        task = await store.get(task_id)
        assert task is not None and task.next_run_ms == start
        assert await index_score(store, task_id) == start + schedule.offset_ms(task_id)
        planned[task_id] = upcoming(task.schedule, task.next_run_ms, 4, task_id, fires_so_far=0)
    assert len({p[0].fire_ms for p in planned.values()}) > 1  # one grid time, spread out

    async def four_each() -> bool:
        fires = await stream_fires(store, "herd")
        return all(sum(f["task_id"] == t for f in fires) >= 4 for t in ids)

    await run_pollers(store, 1, until=four_each, max_tick_s=0.02)
    fires = await stream_fires(store, "herd")
    for task_id, plan in planned.items():
        mine = [f for f in fires if f["task_id"] == task_id][:4]
        assert [int(f["due_ms"]) for f in mine] == [p.due_ms for p in plan]
        for fire, p in zip(mine, plan, strict=True):
            assert int(fire["enq_ms"]) >= p.fire_ms  # never enqueued before its spread time
        # The poller's commit placed the next grid time where the preview says it fires.
        task = await store.get(task_id)
        assert task is not None and task.next_run_ms is not None
        (following,) = upcoming(
            task.schedule, task.next_run_ms, 1, task_id, fires_so_far=task.fires
        )
        assert await index_score(store, task_id) == following.fire_ms


async def test_update_and_resume_place_the_grid_time_with_the_spread(store: TaskStore) -> None:
    later = await store.now_ms() + 3_600_000
    created = await store.create(
        TaskSpec("herd", Schedule("interval", every_s=60, start_ms=later), None, "moved")
    )
    assert await index_score(store, created.task_id) == later  # no spread: the grid time
    spread = Schedule("interval", every_s=60, start_ms=later, spread_s=50)
    await store.update("moved", schedule=spread)
    offset = spread.offset_ms("moved")
    assert offset > 0 and await index_score(store, "moved") == later + offset
    await store.pause("moved")
    assert await index_score(store, "moved") is None
    await store.resume("moved")
    assert await index_score(store, "moved") == later + offset


async def test_h_is_stored_resolved_and_a_repeated_create_is_the_same_definition(
    store: TaskStore,
) -> None:
    hashed = Schedule("cron", cron="H H(1-4) * * *", tz="Europe/Berlin", spread_s=30)
    first = await store.create(TaskSpec("herd", hashed, None, "nightly"))
    again = await store.create(TaskSpec("herd", hashed, None, "nightly"))
    assert first.created and not again.created and not again.conflict
    task = await store.get("nightly")
    assert task is not None and task.schedule == hashed.for_task("nightly")
    assert task.schedule.cron is not None and "H" not in task.schedule.cron
    due = task.next_run_ms
    assert due is not None and task.schedule.next_after(due - 60_000) == due  # on its grid
    assert await index_score(store, "nightly") == task.schedule.fire_ms(due, "nightly")
