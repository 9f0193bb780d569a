"""A task kept scheduled for its flight: fires waiting behind its fire in flight, or that
fire unconfirmed, when its grid ends around them (a resume, a new schedule, a commit, a
claim that plans nothing), against a real Redis. Finished, a task is out of the schedule
and no end of a fire can wake it: the fires would wait for ever."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import pytest
import trio

from actors.api.explain import explain
from actors.api.task_notes import parked_on
from actors.api.upcoming import task_upcoming
from actors.domain.model import TaskSpec
from actors.domain.schedules import Overlap, Schedule
from actors.scheduling.poller import Poller, PollerSettings
from actors.store.flights import ENDED_OK, ORIGIN_LETTERS, FlightEnd, Planned, origin_of
from actors.store.manual_fires import MANUAL_TOKEN
from actors.store.tasks import TaskStore
from runtime.logging import get_logger
from runtime.redis_io import RedisClient
from tests.test_poller import stream_fires
from tests.waiting import eventually


async def _waiting_behind_a_trigger(
    store: TaskStore, schedule: Schedule | None = None
) -> tuple[int, int]:
    """Task ``x`` (type ``t``; ``schedule``, by default hourly from an hour on, buffer_one)
    with an operator's fire in flight and a second one waiting behind it: their due
    times."""
    if schedule is None:
        start = await store.now_ms() + 3_600_000
        schedule = Schedule("interval", every_s=3600, start_ms=start, overlap="buffer_one")
    await store.create(TaskSpec("t", schedule, task_id="x"))
    first, queued = await store.trigger("x", "buffer_one")
    assert queued
    await trio.sleep(0.01)  # another due time (a trigger's is its time)
    second, queued = await store.trigger("x", "buffer_one")
    assert not queued
    return int(first.split(":")[1]), int(second.split(":")[1])


async def _tick(store: TaskStore, poller: Poller) -> int:
    """One tick of the poller over the one partition: the fires it enqueued."""
    return (await poller.tick(await store.scripts(), [0], get_logger())).enqueued


async def _tick_once_due(store: TaskStore, poller: Poller) -> int:
    """Ticks until one enqueues (a task placed a moment ahead, on a clock read from
    Redis that is off by up to half a round trip: on a loaded machine, tens of ms), then
    what it enqueued."""
    enqueued = 0

    async def ticked() -> int:
        nonlocal enqueued
        enqueued = await _tick(store, poller)
        return enqueued

    await eventually(ticked, what="a tick that enqueues")
    return enqueued


async def _queued(store: TaskStore) -> list[int]:
    """The due times in type ``t``'s stream, in order."""
    return [int(f["due_ms"]) for f in await stream_fires(store, "t")]


async def _status(store: TaskStore) -> str:
    task = await store.get("x")
    assert task is not None
    return task.status


async def _score(store: TaskStore, redis_client: RedisClient) -> float | None:
    raw = await redis_client.execute("ZSCORE", (await store.keys()).schedule(0), "x")
    return None if raw is None else float(raw)


async def _the_waiting_fire_starts_then_the_task_finishes(
    store: TaskStore, redis_client: RedisClient, poller: Poller, ahead: int, waiting: int
) -> None:
    """The fire ``ahead`` has ended: the next tick starts ``waiting``, and once that one
    ends the task finishes, out of the schedule."""
    assert await _tick(store, poller) == 1
    assert (await _queued(store))[-2:] == [ahead, waiting]
    await (await store.scripts()).end_flights([FlightEnd("x", ENDED_OK, waiting)])
    await _tick(store, poller)
    assert await _status(store) == "finished"
    assert await _score(store, redis_client) is None


@pytest.mark.parametrize("window_s", [None, 0.05])
async def test_a_task_whose_grid_ended_while_paused_still_starts_its_waiting_fire(
    redis_client: RedisClient, namespace: str, window_s: float | None,
    log_lines: Callable[[], list[dict[str, Any]]],
) -> None:  # fmt: skip
    """A trigger waits behind the task's fire in flight (buffer_one); the task is paused,
    the fire ahead ends, and the task's last grid time passes meanwhile. Resumed, it stays
    active and due until its waiting fire starts, then finishes; the grid time the pause
    skipped is not run. With a catch-up window shorter than the wait for its claim, the
    time it was parked on is not noted as an expired fire either (it is no grid time)."""
    store = TaskStore(redis_client, namespace, default_partitions=1)
    at = await store.now_ms() + 300
    once = Schedule("once", at_ms=at, overlap="buffer_one", catchup_window_s=window_s)
    first, second = await _waiting_behind_a_trigger(store, once)
    await store.pause("x")
    scripts, keys = await store.scripts(), await store.keys()
    await scripts.end_flights([FlightEnd("x", ENDED_OK, first)])
    await trio.sleep(max(0, at + 50 - await store.now_ms()) / 1000)  # its grid time passes
    assert await store.resume("x") == "active"
    await trio.sleep(0.2)  # longer than the catch-up window
    await _the_waiting_fire_starts_then_the_task_finishes(
        store, redis_client, Poller(store, PollerSettings()), first, second
    )
    assert [e for e in log_lines() if e["event"] == "not_run"] == []
    assert await redis_client.execute("HGET", keys.not_run(0), "x") is None


async def test_an_update_to_a_schedule_that_never_fires_still_starts_the_waiting_fire(
    redis_client: RedisClient, namespace: str, log_lines: Callable[[], list[dict[str, Any]]]
) -> None:
    """A trigger waits behind the task's fire in flight (buffer_one) when the task's
    schedule is replaced by one that never fires (its end passed). The task stays active
    and due until the waiting fire starts, is parked while the fire ahead runs, is woken
    by its end, then finishes; the park time is no fire."""
    store = TaskStore(redis_client, namespace, default_partitions=1)
    first, second = await _waiting_behind_a_trigger(store)
    now = await store.now_ms()
    ended = Schedule("interval", every_s=60, end_ms=now - 1000, overlap="buffer_one")
    assert await store.update("x", schedule=ended) == "active"
    score = await _score(store, redis_client)
    assert score is not None and score <= await store.now_ms()
    poller = Poller(store, PollerSettings())
    assert await _tick(store, poller) == 0  # the first still runs
    assert await _status(store) == "active"
    await (await store.scripts()).end_flights([FlightEnd("x", ENDED_OK, first)])
    score = await _score(store, redis_client)
    assert score is not None and score <= await store.now_ms()  # woken by the end
    await _the_waiting_fire_starts_then_the_task_finishes(
        store, redis_client, poller, first, second
    )
    assert [e for e in log_lines() if e["event"] == "not_run"] == []


async def test_an_update_to_no_policy_drops_the_waiting_fires_and_fires_nothing_more(
    redis_client: RedisClient, namespace: str, log_lines: Callable[[], list[dict[str, Any]]]
) -> None:
    """A task with a fire waiting behind its fire in flight gets a schedule that never fires
    and has no overlap policy: the waiting fire goes with the flight record (nothing would
    start it), noted not run (reason ``updated``), and the task finishes, with no fire at a
    park time."""
    store = TaskStore(redis_client, namespace, default_partitions=1)
    _, second = await _waiting_behind_a_trigger(store)
    ended = Schedule("interval", every_s=60, end_ms=await store.now_ms() - 1000)  # allow_all
    assert await store.update("x", schedule=ended) == "finished"
    dropped = [e for e in log_lines() if e["event"] == "not_run"]
    assert [(e["schedule_id"], e["type"], e["reason"]) for e in dropped] == [
        (f"x:{second}", "t", "updated")
    ]
    keys = await store.keys()
    not_run = await redis_client.execute("HGET", keys.not_run(0), "x")
    assert not_run == f"1 updated {second} -".encode()
    assert await redis_client.execute("HGET", keys.flights(0), "x") is None
    assert await _score(store, redis_client) is None
    assert await _tick(store, Poller(store, PollerSettings())) == 0
    assert len(await _queued(store)) == 1


async def test_a_grid_that_ended_with_nothing_planned_still_starts_the_waiting_fire(
    redis_client: RedisClient, namespace: str
) -> None:
    """The new schedule's grid is all in the past and its misfire policy skips it: the claim
    plans no fire and ends the grid, with a fire waiting behind the one in flight. The task
    is parked until that fire starts, then finishes."""
    store = TaskStore(redis_client, namespace, default_partitions=1)
    first, second = await _waiting_behind_a_trigger(store)
    now = await store.now_ms()
    past = Schedule(
        "interval", every_s=1, start_ms=now - 5000, end_ms=now - 1000, overlap="buffer_one",
        misfire="skip",
    )  # fmt: skip
    assert await store.update("x", schedule=past) == "active"
    poller = Poller(store, PollerSettings())
    assert await _tick(store, poller) == 0
    assert await _status(store) == "active"
    await (await store.scripts()).end_flights([FlightEnd("x", ENDED_OK, first)])
    await _the_waiting_fire_starts_then_the_task_finishes(
        store, redis_client, poller, first, second
    )


async def test_a_new_schedule_keeps_a_task_woken_for_its_waiting_fire_due_now(
    redis_client: RedisClient, namespace: str
) -> None:
    """The fire ahead ended and woke the task (due now) for the fire waiting behind it; an
    update gives it a new schedule before its claim. It stays due now: the waiting fire is
    not held back until the new grid's first time, a day on."""
    store = TaskStore(redis_client, namespace, default_partitions=1)
    first, second = await _waiting_behind_a_trigger(store)
    await (await store.scripts()).end_flights([FlightEnd("x", ENDED_OK, first)])
    now = await store.now_ms()
    daily = Schedule("interval", every_s=86400, start_ms=now + 86_400_000, overlap="buffer_one")
    assert await store.update("x", schedule=daily) == "active"
    score = await _score(store, redis_client)
    assert score is not None and score <= await store.now_ms()
    assert await _tick(store, Poller(store, PollerSettings())) == 1
    assert await _queued(store) == [first, second]
    task = await store.get("x")
    assert task is not None and task.next_run_ms == now + 86_400_000


async def test_a_trigger_decided_between_a_claim_and_its_commit_keeps_the_finishing_task(
    redis_client: RedisClient, namespace: str
) -> None:
    """A task's last grid fire is decided (nothing waiting: the grid ends) and an operator's
    trigger decides to wait behind it before the claim's commit. The commit keeps the task
    active and due; the trigger starts when the fire ahead ends, then the task finishes."""
    store = TaskStore(redis_client, namespace, default_partitions=1)
    once = Schedule("once", at_ms=await store.now_ms(), overlap="buffer_one")
    await store.create(TaskSpec("t", once, task_id="x"))
    poller = Poller(store, PollerSettings())
    commit = poller._enqueue_and_commit
    triggered: list[int] = []

    async def trigger_then_commit(*args: Any) -> Any:
        await trio.sleep(0.01)  # another due time than the grid's
        sid, queued = await store.trigger("x", "buffer_one")
        assert not queued  # waits behind the grid fire, decided but not yet committed
        triggered.append(int(sid.split(":")[1]))
        return await commit(*args)

    poller._enqueue_and_commit = trigger_then_commit  # type: ignore[method-assign,assignment]
    assert await _tick(store, poller) == 1
    poller._enqueue_and_commit = commit  # type: ignore[method-assign]
    assert await _status(store) == "active"
    (grid_due,) = await _queued(store)
    await (await store.scripts()).end_flights([FlightEnd("x", ENDED_OK, grid_due)])
    await _the_waiting_fire_starts_then_the_task_finishes(
        store, redis_client, poller, grid_due, triggered[0]
    )


@pytest.mark.parametrize("overlap", ["allow_all", "buffer_one"])
async def test_a_parked_task_updated_on_its_grid_does_not_run_its_grid_time_again(
    redis_client: RedisClient, namespace: str, overlap: Overlap
) -> None:
    """A one-shot parked on its grid time (a trigger waits behind its fire) is given a
    jitter, or no overlap policy (the waiting trigger goes, noted ``updated``): the grid
    time its claim decided is not planned again, and it ran once."""
    store = TaskStore(redis_client, namespace, default_partitions=1)
    once = Schedule("once", at_ms=await store.now_ms(), overlap="buffer_one")
    await store.create(TaskSpec("t", once, task_id="x"))
    poller = Poller(store, PollerSettings())
    commit = poller._enqueue_and_commit

    async def trigger_then_commit(*args: Any) -> Any:
        await trio.sleep(0.01)
        assert not (await store.trigger("x", "buffer_one"))[1]
        return await commit(*args)

    poller._enqueue_and_commit = trigger_then_commit  # type: ignore[method-assign,assignment]
    assert await _tick(store, poller) == 1
    poller._enqueue_and_commit = commit  # type: ignore[method-assign]
    assert await _status(store) == "active"  # parked on its grid time
    (grid_due,) = await _queued(store)
    changed = attrs.evolve(once, overlap=overlap, jitter_s=0.001)
    await store.update("x", schedule=changed)
    await (await store.scripts()).end_flights([FlightEnd("x", ENDED_OK, grid_due)])
    for _ in range(3):
        await _tick(store, poller)
    queued = await _queued(store)
    assert queued.count(grid_due) == 1, queued
    assert len(queued) == (1 if overlap == "allow_all" else 2)  # with the trigger's
    await (await store.scripts()).end_flights([FlightEnd("x", ENDED_OK, queued[-1])])
    await _tick(store, poller)
    assert await _status(store) == "finished"


async def test_an_operators_fire_decided_after_the_task_finished_is_not_held(
    redis_client: RedisClient, namespace: str
) -> None:
    """A trigger read the task active; its last grid fire was committed (the task finished,
    out of the schedule) before the trigger's decision. The trigger is not run (skipped
    behind the fire in flight), not left waiting for a claim that never comes."""
    store = TaskStore(redis_client, namespace, default_partitions=1)
    once = Schedule("once", at_ms=await store.now_ms(), overlap="buffer_one")
    await store.create(TaskSpec("t", once, task_id="x"))
    assert await _tick(store, Poller(store, PollerSettings())) == 1
    assert await _status(store) == "finished"
    late = await store.now_ms() + 5
    decided = await (await store.scripts()).decide_overlaps(
        f"{MANUAL_TOKEN}1", {0: [Planned("x", "1", [late])]}, grid=False
    )
    assert decided["x"].run == [] and decided["x"].skipped == [late]
    flight = await redis_client.execute("HGET", (await store.keys()).flights(0), "x")
    assert flight.decode().split("|")[3] == ""  # nothing waiting


async def test_a_backfill_decided_after_the_task_finished_holds_nothing_back(
    redis_client: RedisClient, namespace: str
) -> None:
    """A buffer_one backfill of two times read the task active; its last grid fire was
    committed and ended before the backfill's decision. The first time starts; the second
    is not run, not left waiting behind it on a task no claim takes again."""
    store = TaskStore(redis_client, namespace, default_partitions=1)
    now = await store.now_ms()
    await store.create(
        TaskSpec("t", Schedule("once", at_ms=now, overlap="buffer_one"), task_id="x")
    )
    assert await _tick(store, Poller(store, PollerSettings())) == 1
    scripts = await store.scripts()
    await scripts.end_flights([FlightEnd("x", ENDED_OK, now)])
    assert await _status(store) == "finished"
    decided = await scripts.decide_overlaps(
        f"{MANUAL_TOKEN}1", {0: [Planned("x", "1", [now - 2000, now - 1000])]}, grid=False
    )
    assert decided["x"].run == [(now - 2000, True)] and decided["x"].skipped == [now - 1000]
    flight = await redis_client.execute("HGET", (await store.keys()).flights(0), "x")
    assert flight.decode().split("|")[3] == ""  # nothing waiting


async def test_a_task_whose_grid_ended_while_paused_keeps_its_unconfirmed_fire(
    redis_client: RedisClient, namespace: str
) -> None:
    """A poller put the task's last grid fire in flight and died before its append and
    commit; the task was paused, and its grid time passed. Resumed, it stays active and
    due (finished, no claim would ever append that fire), and a claim past the takeover
    time appends it."""
    store = TaskStore(redis_client, namespace, default_partitions=1)
    at = await store.now_ms() + 300
    await store.create(TaskSpec("t", Schedule("once", at_ms=at, overlap="skip"), task_id="x"))
    scripts = await store.scripts()
    await scripts.decide_overlaps("dead-claim", {0: [Planned("x", "S", [at])]})
    await store.pause("x")
    await trio.sleep(max(0, at + 50 - await store.now_ms()) / 1000)
    assert await store.resume("x") == "active"
    score = await _score(store, redis_client)
    assert score is not None and score <= await store.now_ms()
    task = await store.get("x")
    assert task is not None and task.next_run_ms is not None
    later = await scripts.decide_overlaps(
        "next-claim", {0: [Planned("x", "S", [task.next_run_ms], ends=True)]}, takeover_ms=0
    )
    assert later["x"].run == [(at, False)]


async def test_a_task_of_no_policy_with_an_operators_fire_unconfirmed_finishes_once(
    redis_client: RedisClient, namespace: str
) -> None:
    """A task of no overlap policy keeps a flight record after an operator's skip trigger,
    whose call died before its confirm. Its last grid fire finishes it, once: no claim of
    such a task decides its flight, so kept scheduled for it, the task fired at its park
    time at every tick. A resume after its grid ended finishes it too."""
    store = TaskStore(redis_client, namespace, default_partitions=1)
    now = await store.now_ms()
    for task_id, at in (("x", now), ("y", now + 300)):
        await store.create(TaskSpec("t", Schedule("once", at_ms=at), task_id=task_id))
    scripts = await store.scripts()
    for task_id in ("x", "y"):
        await scripts.decide_overlaps(
            f"{MANUAL_TOKEN}dead", {0: [Planned(task_id, "S", [now - 1000])]}, grid=False
        )
    await store.pause("y")
    poller = Poller(store, PollerSettings())
    assert await _tick(store, poller) == 1
    for _ in range(3):
        assert await _tick(store, poller) == 0
    assert await _status(store) == "finished"
    assert len(await _queued(store)) == 1
    await trio.sleep(max(0, now + 350 - await store.now_ms()) / 1000)
    assert await store.resume("y") == "finished"


async def test_a_woken_task_waits_for_another_deciders_fire_no_later_than_its_grid_time(
    redis_client: RedisClient, namespace: str
) -> None:
    """The end of a fire woke the task for the fire waiting behind it, and an operator's
    call started that fire but has not confirmed it yet when the poller claims the task.
    The claim waits for that call, but no longer than the task's next grid time: that
    time is claimed when it comes, not a claim lease late."""
    store = TaskStore(redis_client, namespace, default_partitions=1)
    now = await store.now_ms()
    due = now + 30_000
    hourly = Schedule("interval", every_s=3600, start_ms=due, overlap="buffer_one")
    first, _ = await _waiting_behind_a_trigger(store, hourly)
    scripts = await store.scripts()
    await scripts.end_flights([FlightEnd("x", ENDED_OK, first)])
    started = await scripts.decide_overlaps(
        f"{MANUAL_TOKEN}slow", {0: [Planned("x", "1", [])]}, grid=False, takeover_ms=120_000
    )
    assert len(started["x"].run) == 1  # the waiting fire, in flight, not yet confirmed
    assert await _tick(store, Poller(store, PollerSettings(claim_lease_ms=120_000))) == 0
    score = await _score(store, redis_client)
    assert score is not None and score < due + 45_000  # about its grid time, not a lease (120 s) on


@pytest.mark.parametrize("by_action", [False, True])
async def test_a_stop_drops_the_waiting_fires_each_noted_not_run(
    redis_client: RedisClient, namespace: str, log_lines: Callable[[], list[dict[str, Any]]],
    by_action: bool,
) -> None:  # fmt: skip
    """A trigger waits behind the task's fire in flight (buffer_one) when the task is
    stopped, by its own call or by an operator's action: no claim comes for a stopped task,
    so the waiting fire is dropped, a ``not_run`` line (reason ``stopped``) and the task's
    not-run record say so, and the end of the fire ahead starts nothing."""
    from actors.store.actions import ActionSpec, create_action
    from actors.store.apply_actions import ActionSettings, apply_action

    store = TaskStore(redis_client, namespace, default_partitions=1)
    first, second = await _waiting_behind_a_trigger(store)
    if by_action:
        spec = ActionSpec.from_dict({"action": "stop", "selector": {"type": "t"}})
        await create_action(store, "s1", spec, None, "me", 60_000)
        await apply_action(store, "s1", "me", ActionSettings())
    else:
        assert await store.stop("x") == "stopped"
    assert await _status(store) == "stopped"
    dropped = [e for e in log_lines() if e["event"] == "not_run"]
    assert [(e["schedule_id"], e["type"], e["due_ms"], e["reason"]) for e in dropped] == [
        (f"x:{second}", "t", second, "stopped")
    ]
    keys = await store.keys()
    record = await redis_client.execute("HGET", keys.not_run(0), "x")
    assert record == f"1 stopped {second} -".encode()
    flight = await redis_client.execute("HGET", keys.flights(0), "x")
    assert flight is not None and flight.split(b"|")[3] == b""  # nothing waits
    await (await store.scripts()).end_flights([FlightEnd("x", ENDED_OK, first)])
    assert await _score(store, redis_client) is None
    assert await _tick(store, Poller(store, PollerSettings())) == 0
    assert await _queued(store) == [first]


@pytest.mark.parametrize("grid", [True, False])
async def test_a_decision_after_a_stop_holds_nothing_behind_the_fire_in_flight(
    redis_client: RedisClient, namespace: str, grid: bool
) -> None:
    """A claim taken before the task's stop (or an operator's call that read it active)
    decides after it, while the task's fire is in flight: the time that would wait behind
    it is skipped instead, as nothing will ever start it for a stopped task."""
    store = TaskStore(redis_client, namespace, default_partitions=1)
    start = await store.now_ms() + 3_600_000
    every = Schedule("interval", every_s=3600, start_ms=start, overlap="buffer_one")
    await store.create(TaskSpec("t", every, task_id="x"))
    _, queued = await store.trigger("x", "buffer_one")
    assert queued
    assert await store.stop("x") == "stopped"
    due = await store.now_ms() + 1
    scripts = await store.scripts()
    token = "a-claim" if grid else f"{MANUAL_TOKEN}call"
    decided = await scripts.decide_overlaps(token, {0: [Planned("x", "1", [due])]}, grid=grid)
    assert (decided["x"].run, decided["x"].skipped) == ([], [due])
    flight = await redis_client.execute("HGET", (await store.keys()).flights(0), "x")
    assert flight.split(b"|")[3] == b""  # nothing waits


async def test_an_earlier_tasks_dead_fire_counts_in_no_streak_of_one_created_again_under_its_id(
    redis_client: RedisClient, namespace: str
) -> None:
    """A task with a failure limit of one fire is deleted while its fire runs and created
    again under its id; the old fire then ends dead, as its consumer reports it (from the
    policy code in its message, which names the task's creation): the new task is not
    paused, and keeps no streak. The dead end of its own fire pauses it."""
    from actors.store.flights import ENDED_DEAD, ENDED_EXPIRED, parse_policy

    store = TaskStore(redis_client, namespace, default_partitions=1)
    soon = Schedule("interval", every_s=3600, start_ms=await store.now_ms() + 50,
                    pause_after_failures=1)  # fmt: skip
    await store.create(TaskSpec("t", soon, task_id="x"))
    poller = Poller(store, PollerSettings())
    assert await _tick_once_due(store, poller) == 1
    (fire,) = await stream_fires(store, "t")

    def dead_end(fire: dict[str, str]) -> FlightEnd:  # as completion._flight_ends makes it
        policy = parse_policy(fire["o"])
        assert policy.born is not None
        return FlightEnd("x", ENDED_DEAD, int(fire["due_ms"]), policy.pause_after, "boom",
                         policy.born)  # fmt: skip

    assert await store.delete("x")
    again = attrs.evolve(soon, start_ms=await store.now_ms() + 50)
    await store.create(TaskSpec("t", again, task_id="x"))
    scripts, keys = await store.scripts(), await store.keys()
    assert await scripts.end_flights([dead_end(fire)]) == []
    assert await _status(store) == "active"
    assert await redis_client.execute("HGET", keys.flights(0), "x") is None
    expired = attrs.evolve(dead_end(fire), ended=ENDED_EXPIRED)  # nor noted on the new one
    assert await scripts.end_flights([expired]) == []
    assert await redis_client.execute("HGET", keys.not_run(0), "x") is None
    assert await _tick_once_due(store, poller) == 1
    own = (await stream_fires(store, "t"))[-1]
    assert parse_policy(own["o"]).born != parse_policy(fire["o"]).born
    assert await scripts.end_flights([dead_end(own)]) == [("x", 1)]
    assert await _status(store) == "paused"


async def test_an_earlier_tasks_fire_ending_clears_the_mark_it_left_on_a_new_one(
    redis_client: RedisClient, namespace: str
) -> None:
    """A decision about a task made after its delete left a mark in flight for that fire,
    and the task is created again under its id: the fire's end (expired, past its window)
    clears the mark, though it changes nothing else of the new task, or every later fire
    of the new one would wait behind it for good."""
    from actors.store.flights import ENDED_EXPIRED

    store = TaskStore(redis_client, namespace, default_partitions=1)
    hourly = Schedule("interval", every_s=3600, overlap="buffer_one", pause_after_failures=1)
    await store.create(TaskSpec("t", hourly, task_id="x"))
    earlier = await store.get("x")
    assert earlier is not None
    assert await store.delete("x")
    await store.create(TaskSpec("t", hourly, task_id="x"))
    keys, scripts = await store.keys(), await store.scripts()
    await redis_client.execute("HSET", keys.flights(0), "x", "1000|||||")  # the leftover
    end = FlightEnd("x", ENDED_EXPIRED, 1000, 1, "", earlier.created_ms)
    assert await scripts.end_flights([end]) == []
    assert await redis_client.execute("HGET", keys.flights(0), "x") is None
    assert await redis_client.execute("HGET", keys.not_run(0), "x") is None


async def _one_shot_due_behind_a_trigger(store: TaskStore) -> tuple[int, str]:
    """Task ``x``, a one-shot (buffer_one) whose time has just come while a trigger's fire
    is in flight: that time, and the trigger's schedule_id."""
    at = await store.now_ms() + 200
    once = Schedule("once", at_ms=at, overlap="buffer_one")
    await store.create(TaskSpec("t", once, task_id="x"))
    trigger, queued = await store.trigger("x", "buffer_one")
    assert queued
    await trio.sleep(max(0, at + 50 - await store.now_ms()) / 1000)
    return at, trigger


@pytest.mark.parametrize("dead_claim", [False, True])
async def test_a_parked_tasks_wake_does_not_count_its_park_time_again(
    redis_client: RedisClient, namespace: str, dead_claim: bool
) -> None:
    """A one-shot's time comes while a trigger is in flight (buffer_one): it waits, its
    grid ends, and the task is parked on it. Each wake plans that time again; the claim
    that parked it counted it, and the task's fires count it once, through its start
    and its end; ``upcoming`` does not list it as a fire to come. ``dead_claim``: a
    poller decided that time first (set it waiting) and died before its commit: counted
    by the claim of the poller that takes over, not taken as counted before."""
    store = TaskStore(redis_client, namespace, default_partitions=1)
    at, trigger = await _one_shot_due_behind_a_trigger(store)
    poller, scripts = Poller(store, PollerSettings()), await store.scripts()
    if dead_claim:
        (claim,) = await scripts.claim_due([0], "dead", "tok-1", 100, 100)
        assert [t.task_id for t in claim.tasks] == ["x"]
        planned = Planned("x", "1", [at], ends=True, task_type="t")
        decided = await scripts.decide_overlaps("tok-1", {0: [planned]})
        assert decided["x"].run == [] and decided["x"].park == at  # waits behind the trigger
        await trio.sleep(0.2)  # the dead poller's lease has ended

    async def fires() -> int:
        task = await store.get("x")
        assert task is not None
        return task.fires

    assert await _tick(store, poller) == 0  # its time waits behind the trigger
    assert (await _status(store), await fires()) == ("active", 1)
    task = await store.get("x")
    assert task is not None and task.next_run_ms == at  # parked on it: no fire to come
    parked = await parked_on(store, "x")
    assert task_upcoming(task, 3, await store.now_ms(), parked)["fires"] == []
    facts = await explain(store, "x")
    assert (facts["parked_ms"], facts["upcoming"]) == (at, [])
    assert "to start the fires waiting behind its fire in flight" in facts["summary"][0]
    await scripts.end_flights([FlightEnd("x", ENDED_OK, int(trigger.split(":")[1]))])
    assert await _tick(store, poller) == 1
    assert (await _queued(store))[-1] == at and await fires() == 1
    await scripts.end_flights([FlightEnd("x", ENDED_OK, at)])
    await _tick(store, poller)
    assert (await _status(store), await fires()) == ("finished", 1)


async def test_held_operator_fires_keep_their_origin_when_a_poller_starts_them(
    redis_client: RedisClient, namespace: str
) -> None:
    """A trigger, then a backfilled grid time, wait behind the task's fire in flight
    (buffer_all): started by the poller once the fire ahead ends, each keeps its origin
    (told as a trigger and a backfill, not a scheduled fire judged late by its wait)."""
    store = TaskStore(redis_client, namespace, default_partitions=1)
    now = await store.now_ms()
    start = now - 3_600_000 - 1_800_000  # a grid time half an hour into the last hour
    every = Schedule("interval", every_s=3600, start_ms=start, overlap="buffer_all")
    await store.create(TaskSpec("t", every, task_id="x"))
    poller, scripts = Poller(store, PollerSettings()), await store.scripts()
    assert await _tick(store, poller) == 1  # the grid time just passed: in flight
    (ahead,) = await _queued(store)
    trigger, queued = await store.trigger("x", "buffer_all")
    assert not queued
    backfill = await store.backfill("x", start, start + 1)
    assert backfill.held_back == 1, backfill
    await scripts.end_flights([FlightEnd("x", ENDED_OK, ahead)])
    assert await _tick(store, poller) == 1  # the trigger first, the backfill behind it
    await scripts.end_flights([FlightEnd("x", ENDED_OK, int(trigger.split(":")[1]))])
    assert await _tick(store, poller) == 1
    fires = {int(f["due_ms"]): f for f in await stream_fires(store, "t")}
    assert origin_of(fires[int(trigger.split(":")[1])]["o"]) == ORIGIN_LETTERS["t"]
    assert origin_of(fires[start]["o"]) == ORIGIN_LETTERS["b"]
    assert origin_of(fires[ahead].get("o", "")) == 0


async def test_a_park_time_an_update_revives_its_grid_on_is_counted_once(
    redis_client: RedisClient, namespace: str
) -> None:
    """An interval whose grid ends at its first time parks on it behind a trigger (counted
    then). Its wake starts that time, and the waking poller dies before its commit; an
    update on the same grid gives it room: the task goes on from that time, which the next
    claim appends again and does not count again."""
    store = TaskStore(redis_client, namespace, default_partitions=1)
    at = await store.now_ms() + 200
    ending = Schedule("interval", every_s=60, start_ms=at, end_ms=at, overlap="buffer_one")
    await store.create(TaskSpec("t", ending, task_id="x"))
    trigger, queued = await store.trigger("x", "buffer_one")
    assert queued
    await trio.sleep(max(0, at + 50 - await store.now_ms()) / 1000)
    scripts = await store.scripts()
    poller = Poller(store, PollerSettings(claim_lease_ms=100))
    assert await _tick(store, poller) == 0  # parked on its time, counted
    await scripts.end_flights([FlightEnd("x", ENDED_OK, int(trigger.split(":")[1]))])
    planned = Planned("x", "1", [at], ends=True, task_type="t")
    started = await scripts.decide_overlaps("tok-dead", {0: [planned]})
    assert started["x"].run == [(at, True)]  # then its poller died: not appended
    longer = attrs.evolve(ending, end_ms=at + 3_600_000)
    assert await store.update("x", schedule=longer) == "active"
    await trio.sleep(0.2)  # the dead decider's lease is over

    async def appended() -> bool:
        await _tick(store, poller)
        return at in await _queued(store)

    await eventually(appended, poll_s=0.05)
    task = await store.get("x")
    assert task is not None and (task.fires, task.next_run_ms) == (1, at + 60_000)


async def test_a_schedule_on_another_grid_forgets_the_park_time(
    redis_client: RedisClient, namespace: str
) -> None:
    """A task parked on its one-shot's time (waiting behind a trigger) is given a schedule
    on another grid: the park mark goes with the grid it leaves (a time of the new grid
    is no park time, and is counted)."""
    store = TaskStore(redis_client, namespace, default_partitions=1)
    at, _ = await _one_shot_due_behind_a_trigger(store)
    assert await _tick(store, Poller(store, PollerSettings())) == 0  # parked on its time
    keys = await store.keys()
    assert await redis_client.execute("HGET", keys.parked(0), "x") == str(at).encode()
    hourly = Schedule("interval", every_s=3600, overlap="buffer_one")
    await store.update("x", schedule=hourly)
    assert await redis_client.execute("HGET", keys.parked(0), "x") is None
