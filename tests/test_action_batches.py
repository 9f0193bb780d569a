"""An operator's action over a selector, applied batch by batch: each batch is applied to
the tasks as they are when it is sent, not as they were when their partition was
selected (seconds earlier, at a paced rate). A real Redis, the store's applier."""

from __future__ import annotations

import pytest
import trio

from actors.domain.model import Task, TaskSpec
from actors.domain.schedules import Schedule
from actors.store.actions import ActionSpec, ActionState, create_action
from actors.store.apply_actions import ActionSettings, apply_action
from actors.store.selection import Selector
from actors.store.tasks import TaskStore
from runtime.redis_io import RedisClient
from tests.waiting import eventually


async def test_a_task_that_stopped_matching_meanwhile_is_left_alone(
    redis_client: RedisClient, namespace: str
) -> None:
    """A delete of every paused task, paced to five a second: a task resumed after its
    partition was selected, before its batch, is active by then and must not be deleted."""
    store = TaskStore(redis_client, namespace, default_partitions=4)
    keys = await store.keys()
    ids = [t for t in (f"p{i:02d}" for i in range(100)) if keys.partition_of(t) == 2][:5]
    for task_id in ids:
        await store.create(TaskSpec("chores", Schedule("interval", every_s=3600), task_id=task_id))
        await store.pause(task_id)
    selector = Selector.from_dict({"type": "chores", "status": "paused"})
    assert (
        await create_action(store, "del", ActionSpec("delete", selector), None, "me", 60_000)
        is None
    )
    settings = ActionSettings(batch=1, rate=5)

    async def first_done() -> bool:
        last = await redis_client.execute("HGET", keys.action_progress(2, "del"), "last")
        return bool(last == ids[0].encode())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(apply_action, store, "del", "me", settings)
        await eventually(first_done, 30, poll_s=0.01)  # selected, its first batch applied
        await store.resume(ids[-1])
    assert [await store.get(t) is None for t in ids] == [True] * 4 + [False]
    kept = await store.get(ids[-1])
    assert kept is not None and kept.status == "active"


async def test_a_trigger_whose_stream_is_rejected_fires_each_task_once_mended(
    redis_client: RedisClient, namespace: str
) -> None:
    """A trigger action applied while its type's stream key holds another kind of value
    (WRONGTYPE) fails and is applied again (the resumer, or the operator's repeat): no
    task is taken as fired whose fire was never appended, and once the key is mended each
    task's fire is appended once."""
    from actors.store.actions import take_lease

    store = TaskStore(redis_client, namespace, default_partitions=1)
    ids = [f"t{i}" for i in range(4)]
    for task_id in ids:
        await store.create(TaskSpec("work", Schedule("interval", every_s=3600), task_id=task_id))
    keys = await store.keys()
    stream = keys.queue("work")
    await redis_client.execute("DEL", stream)
    await redis_client.execute("SET", stream, "not a stream")
    spec = ActionSpec.from_dict({"action": "trigger", "selector": {"type": "work"}})
    await create_action(store, "a1", spec, None, "me", 60_000)
    for _ in range(3):
        await take_lease(store, "a1", "me", 60_000)
        with pytest.raises(Exception, match="WRONGTYPE"):  # as the resumer's ride_out sees it
            await apply_action(store, "a1", "me", ActionSettings())
    assert await redis_client.execute("HGETALL", keys.action_fired("work", "a1")) == {}
    await redis_client.execute("DEL", stream)  # mended
    await take_lease(store, "a1", "me", 60_000)
    await apply_action(store, "a1", "me", ActionSettings())
    entries = await redis_client.execute("XRANGE", stream, "-", "+")
    fired = sorted(fields[b"task_id"].decode() for _, fields in entries)
    assert fired == ids


async def test_a_held_trigger_that_ran_is_not_appended_again_when_its_batch_is_repeated(
    redis_client: RedisClient, namespace: str
) -> None:
    """A trigger action under buffer_one: a task's fire waits behind the one in flight, its
    poller starts it once that one ends, and it runs and ends. The applier died before
    marking the batch, so the batch is applied again: the task's fire is the action's
    already, and is not appended a second time."""
    from actors.store.apply_actions import _trigger
    from actors.store.flights import FlightEnd, Planned

    store = TaskStore(redis_client, namespace, default_partitions=1)
    state, task = await _a_trigger_held_then_its_fire_ahead_ended(
        store, Schedule("interval", every_s=3600, overlap="skip"), "a2"
    )
    keys, scripts = await store.keys(), await store.scripts()
    started = await scripts.decide_overlaps("claim", {0: [Planned("x", "S", [])]})
    assert [d for d, _ in started["x"].run] == [state.created_ms]  # the poller appends it
    await scripts.end_flights([FlightEnd("x", 0, state.created_ms)])  # it ran and ended
    before = await redis_client.execute("XLEN", keys.queue("work"))
    await _trigger(store, state, [task])  # the batch again
    assert await redis_client.execute("XLEN", keys.queue("work")) == before
    flight = await redis_client.execute("HGET", keys.flights(0), "x")
    assert flight is None or flight.split(b"|")[0] == b""  # nothing left in flight


async def test_a_held_trigger_a_dead_poller_started_is_appended_as_the_operators(
    redis_client: RedisClient, namespace: str
) -> None:
    """A trigger action's fire held back behind the task's fire in flight; that one ends,
    a poller starts the held fire and dies before appending it; the batch is applied
    again. The repeat leaves the task be (its fire is held, not appended: confirming it
    would leave it in flight with no message behind it, the task stuck), and the next
    decision appends it again as the operator's fire (no catch-up window)."""
    from actors.store.apply_actions import _trigger
    from actors.store.flights import Planned

    store = TaskStore(redis_client, namespace, default_partitions=1, takeover_ms=0)
    every = Schedule("interval", every_s=3600, overlap="skip", catchup_window_s=60)
    state, task = await _a_trigger_held_then_its_fire_ahead_ended(store, every, "a3")
    keys, scripts = await store.keys(), await store.scripts()
    started = await scripts.decide_overlaps("dead-claim", {0: [Planned("x", "S", [])]})
    assert [d for d, _ in started["x"].run] == [state.created_ms]  # then its poller died
    before = await redis_client.execute("XLEN", keys.queue("work"))
    assert await _trigger(store, state, [task]) == {"x": "0"}  # left be
    assert await redis_client.execute("XLEN", keys.queue("work")) == before
    again = await scripts.decide_overlaps("next-claim", {0: [Planned("x", "S", [])]})
    assert again["x"].run == [(state.created_ms, False)]
    assert again["x"].manual == {state.created_ms}  # the operator's: no catch-up window


async def test_an_appended_trigger_is_not_decided_again_when_its_batch_is_repeated(
    redis_client: RedisClient, namespace: str
) -> None:
    """A buffer_one trigger action appends a task's fire (nothing in flight) and its
    applier dies before marking the batch; the fire runs and ends, another fire of the
    task is in flight when the batch is applied again. Decided again, the action's fire
    waited behind that one and its poller appended it a second time; the repeat finds it
    appended and counts it changed, as the first run did, deciding nothing."""
    from actors.store.actions import read_action
    from actors.store.apply_actions import _trigger
    from actors.store.flights import FlightEnd, Planned

    store = TaskStore(redis_client, namespace, default_partitions=1)
    await store.create(
        TaskSpec("work", Schedule("interval", every_s=3600, overlap="skip"), task_id="x")
    )
    spec = ActionSpec.from_dict(
        {"action": "trigger", "overlap": "buffer_one", "selector": {"ids": ["x"]}}
    )
    await create_action(store, "a4", spec, None, "me", 60_000)
    state = await read_action(store, "a4")
    task = await store.get("x")
    assert state is not None and task is not None
    keys, scripts = await store.keys(), await store.scripts()
    assert await _trigger(store, state, [task]) == {"x": "1"}  # appended; then it died
    await scripts.end_flights([FlightEnd("x", 0, state.created_ms)])  # it ran and ended
    await trio.sleep(0.01)
    sid, _ = await store.trigger("x", "skip")  # another fire of the task in flight
    assert await _trigger(store, state, [task]) == {"x": "1"}  # the batch again
    await scripts.end_flights([FlightEnd("x", 0, int(sid.split(":")[1]))])
    started = await scripts.decide_overlaps("claim", {0: [Planned("x", "S", [])]})
    assert state.created_ms not in [d for d, _ in started["x"].run]
    assert await redis_client.execute("HGET", keys.not_run(0), "x") is None


async def _a_trigger_held_then_its_fire_ahead_ended(
    store: TaskStore, schedule: Schedule, action_id: str
) -> tuple[ActionState, Task]:
    """Task ``x`` of ``schedule`` with a fire in flight; a buffer_one trigger action's fire
    held back behind it (its batch applied once); then the fire ahead ended. Returns the
    action's state and the task."""
    from actors.store.actions import read_action
    from actors.store.apply_actions import _trigger
    from actors.store.flights import FlightEnd

    await store.create(TaskSpec("work", schedule, task_id="x"))
    sid, queued = await store.trigger("x", "skip")  # a fire in flight ahead of the action's
    assert queued
    # the action's fire is due at its creation: another millisecond than the fire ahead
    # (the same due time would be that fire, decided already, and never start)
    await trio.sleep(0.01)
    spec = ActionSpec.from_dict(
        {"action": "trigger", "overlap": "buffer_one", "selector": {"ids": ["x"]}}
    )
    await create_action(store, action_id, spec, None, "me", 60_000)
    state = await read_action(store, action_id)
    assert state is not None
    task = await store.get("x")
    assert task is not None
    assert await _trigger(store, state, [task]) == {"x": "0"}  # held back
    scripts = await store.scripts()
    await scripts.end_flights([FlightEnd("x", 0, int(sid.split(":")[1]))])
    return state, task


async def test_a_trigger_action_at_a_tasks_grid_time_is_a_fire_of_its_own(
    redis_client: RedisClient, namespace: str
) -> None:
    """An action's time that is one of a task's grid times (one in 60,000 tasks of a minute
    grid, for any action) fires that task at the next millisecond: sharing the grid
    fire's schedule_id, one of the two was dropped as a duplicate by the consumers'
    dedupe window (under an overlap policy, the action's was taken as decided)."""
    from actors.store.actions import take_lease

    store = TaskStore(redis_client, namespace, default_partitions=1)
    spec = ActionSpec.from_dict({"action": "trigger", "selector": {"type": "work"}})
    await create_action(store, "a1", spec, None, "me", 60_000)
    keys = await store.keys()
    at = int(await redis_client.execute("HGET", keys.action_record("a1"), "created_ms"))
    grid = Schedule("interval", every_s=60, start_ms=at)
    await store.create(TaskSpec("work", grid, task_id="on-grid"))
    off = Schedule("interval", every_s=3600, start_ms=at + 7)
    await store.create(TaskSpec("work", off, task_id="off-grid"))
    await take_lease(store, "a1", "me", 60_000)
    await apply_action(store, "a1", "me", ActionSettings())
    entries = await redis_client.execute("XRANGE", keys.queue("work"), "-", "+")
    dues = {f[b"task_id"].decode(): int(f[b"due_ms"]) for _, f in entries}
    assert dues == {"on-grid": at + 1, "off-grid": at}
