"""The scripts of fires in flight called directly against a real Redis: the edge cases a
poller or an operator's call dying half-way leaves behind."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from actors.store.flights import ENDED_DEAD, ENDED_OK, FlightEnd, Planned
from actors.store.keys import Keys
from actors.store.manual_fires import MANUAL_TOKEN
from actors.store.replies import Fire
from actors.store.scripts import Scripts
from runtime.redis_io import RedisClient


@pytest.fixture
def scripts(redis_client: RedisClient, namespace: str) -> Scripts:
    return Scripts(redis_client, Keys(namespace, 1))


async def _exists(scripts: Scripts, task_id: str) -> None:
    """A state record: the task exists."""
    keys = scripts.keys
    await scripts.client.execute("HSET", keys.states(0, keys.bucket_of(task_id)), task_id, b"\0")


async def _record(scripts: Scripts, task_id: str) -> list[str]:
    raw = await scripts.client.execute("HGET", scripts.keys.flights(0), task_id)
    return [] if raw is None else raw.decode().split("|")


async def test_a_fire_never_confirmed_is_appended_again_by_the_next_decision(
    scripts: Scripts,
) -> None:
    """A poller put a fire in flight and died before its append (its claim long
    forgotten): the next claim appends it again instead of skipping behind it forever."""
    await _exists(scripts, "t")
    first = await scripts.decide_overlaps("dead-claim", {0: [Planned("t", "S", [1000])]})
    assert first["t"].run == [(1000, True)]
    later = await scripts.decide_overlaps("next-claim", {0: [Planned("t", "S", [2000])]})
    assert later["t"].run == [(1000, False)]  # again: the enqueue markers drop a copy
    assert later["t"].skipped == [2000] and later["t"].blocking == 1000
    await scripts.confirm_flights("next-claim", ["t"])
    confirmed = await scripts.decide_overlaps("third", {0: [Planned("t", "S", [3000])]})
    assert confirmed["t"].run == [] and confirmed["t"].skipped == [3000]


async def test_a_fire_another_decider_may_still_append_is_left_to_it(
    scripts: Scripts,
) -> None:
    """A poller put a fire in flight and is on its way to append it; an operator's trigger
    decides about the task meanwhile (or the other way round). Appending it again would run
    a skip task's fire twice: within the takeover time it is left to its decider, and
    appended again only once its decider must be gone (or by the same claim sent again)."""
    await _exists(scripts, "t")
    poller = await scripts.decide_overlaps(
        "claim", {0: [Planned("t", "S", [1000])]}, takeover_ms=60_000
    )
    assert poller["t"].run == [(1000, True)]
    trigger = await scripts.decide_overlaps(
        "manual", {0: [Planned("t", "S", [5000])]}, grid=False, takeover_ms=60_000
    )
    assert trigger["t"].run == [] and trigger["t"].skipped == [5000]
    again = await scripts.decide_overlaps(
        "claim", {0: [Planned("t", "S", [1000])]}, takeover_ms=60_000
    )
    assert again["t"].run == [(1000, False)]  # its own claim, sent again
    await scripts.client.execute("HDEL", scripts.keys.flights(0), "t")
    held = await scripts.decide_overlaps(
        f"{MANUAL_TOKEN}2", {0: [Planned("t", "S", [6000])]}, grid=False, takeover_ms=60_000
    )
    assert held["t"].run == [(6000, True)]
    claim = await scripts.decide_overlaps(
        "claim-2", {0: [Planned("t", "S", [7000])]}, takeover_ms=60_000
    )
    assert claim["t"].run == [] and claim["t"].skipped == [7000]
    late = await scripts.decide_overlaps("claim-3", {0: [Planned("t", "S", [8000])]}, takeover_ms=0)
    assert late["t"].run == [(6000, False)]  # its decider taken as gone: appended again
    # ... as the operator's fire it is (the policy's letter alone: no catch-up window
    # drops a backfilled grid time as too old)
    assert late["t"].manual == {6000}


async def test_a_fire_held_back_by_an_operator_runs_with_the_letter_alone(
    scripts: Scripts,
) -> None:
    """A backfill's fire waiting behind the one in flight starts later without the task's
    catch-up window (an operator's fire is never too late)."""
    await _exists(scripts, "t")
    await scripts.decide_overlaps("c1", {0: [Planned("t", "B", [1000])]})
    await scripts.confirm_flights("c1", ["t"])
    held = await scripts.decide_overlaps("op", {0: [Planned("t", "B", [10, 20])]}, grid=False)
    assert held["t"].run == [] and held["t"].skipped == []
    await scripts.end_flights([FlightEnd("t", ENDED_OK, 1000)])
    woken = await scripts.decide_overlaps("c2", {0: [Planned("t", "B", [])]})
    assert woken["t"].run == [(10, True)] and woken["t"].manual == {10}


async def test_a_cancel_is_asked_again_until_the_replaced_fire_ends(scripts: Scripts) -> None:
    await _exists(scripts, "t")
    await scripts.decide_overlaps("c1", {0: [Planned("t", "C", [1000])]})
    await scripts.confirm_flights("c1", ["t"])
    replaced = await scripts.decide_overlaps("c2", {0: [Planned("t", "C", [2000])]})
    assert replaced["t"].cancel == [1000] and replaced["t"].run == []
    # c2's poller died before it sent the cancel: the next decision asks again.
    again = await scripts.decide_overlaps("c3", {0: [Planned("t", "C", [3000])]})
    assert again["t"].cancel == [1000] and again["t"].skipped == [2000]
    await scripts.end_flights([FlightEnd("t", 3, 1000)])  # cancelled: the newest starts
    started = await scripts.decide_overlaps("c4", {0: [Planned("t", "C", [])]})
    assert started["t"].run == [(3000, True)] and started["t"].cancel == []


async def test_the_end_of_a_deleted_tasks_fire_keeps_nothing(scripts: Scripts) -> None:
    """No streak, no mark: a task created again under the id starts clean."""
    await scripts.decide_overlaps("c1", {0: [Planned("gone", "S", [1000])]})
    await scripts.end_flights([FlightEnd("gone", ENDED_DEAD, 1000, pause_after=5)])
    assert await _record(scripts, "gone") == []


async def test_an_enqueue_drops_a_fire_any_of_its_prior_claims_appended(
    scripts: Scripts,
) -> None:
    """Two claims never committed before this one: a fire the second appended is found."""
    await scripts.client.execute("XGROUP", "CREATE", scripts.keys.queue("w"), "metronome", "0",
                                 "MKSTREAM")  # fmt: skip
    fire = Fire("t", "w", "{}", 1000)
    assert await scripts.enqueue([fire], 1000, 60_000, "claim-2") == [True]
    again = Fire("t", "w", "{}", 1000, prior="claim-1 claim-2")
    assert await scripts.enqueue([again], 1000, 60_000, "claim-3") == [False]
    assert await scripts.client.execute("XLEN", scripts.keys.queue("w")) == 1


async def _not_run(scripts: Scripts, task_id: str) -> str:
    raw = await scripts.client.execute("HGET", scripts.keys.not_run(0), task_id)
    return "" if raw is None else raw.decode()


@pytest.mark.parametrize("letter", ["A", "S"])
async def test_expired_grid_times_decided_again_are_counted_once(
    scripts: Scripts, letter: str
) -> None:
    """A decision repeated (the same claim sent again after a lost reply, or a task whose
    stream Redis rejects claimed again a lease later with its grid unmoved) sees the same
    expired grid times again: the not-run count ``explain`` shows counts each once."""
    await _exists(scripts, "t")
    await scripts.decide_overlaps("claim", {0: [Planned("t", letter, [5000], [1000, 2000])]})
    assert await _not_run(scripts, "t") == "2 expired 2000 -"
    again = await scripts.decide_overlaps(
        "claim", {0: [Planned("t", letter, [5000], [1000, 2000])]}
    )
    assert await _not_run(scripts, "t") == "2 expired 2000 -"
    # not known as decided: the poller says their not_run lines (a held task's, said by
    # the claim that decides it again, or a repeat after a lost reply)
    assert again["t"].known == frozenset()
    await scripts.decide_overlaps("next", {0: [Planned("t", letter, [], [1000, 2000, 3000])]})
    assert await _not_run(scripts, "t") == "3 expired 3000 -"
    # A later grid decision counts its own expired times (and only those).
    await scripts.decide_overlaps("later", {0: [Planned("t", letter, [], [7000])]})
    assert await _not_run(scripts, "t") == "4 expired 7000 -"


async def test_grid_times_decided_before_are_not_noted_expired_when_planned_again(
    scripts: Scripts,
) -> None:
    """A claim decided three grid times (one in flight, two skipped) and its poller died
    before its commit; the next claim plans them again, now past the catch-up window: they
    were decided (the one in flight, the skipped ones in the history), so none is noted
    expired, and they go back as known (no not_run line). A time below the latest decided
    that none of these holds (owed after a takeover, never decided) is noted."""
    await _exists(scripts, "t")
    first = await scripts.decide_overlaps("c1", {0: [Planned("t", "S", [1000, 2000, 3000])]})
    assert first["t"].skipped == [2000, 3000]
    await scripts.confirm_flights("c1", ["t"])
    again = await scripts.decide_overlaps("c2", {0: [Planned("t", "S", [], [1000, 2000, 3000])]})
    assert again["t"].known == {1000, 2000, 3000}
    assert await _not_run(scripts, "t") == "2 overlap 3000 1000"
    owed = await scripts.decide_overlaps("c3", {0: [Planned("t", "S", [], [500, 3000])]})
    assert owed["t"].known == {3000}
    assert await _not_run(scripts, "t") == "3 expired 500 -"


async def test_a_fire_held_back_while_its_task_was_paused_starts_when_it_resumes(
    redis_client: RedisClient, namespace: str
) -> None:
    """A trigger waits behind the task's fire in flight (buffer_one); the task is paused,
    and the fire ahead ends meanwhile (its end cannot wake a task out of the schedule).
    Resumed, the task is due at once, and its claim starts the waiting fire, rather than
    at its next grid time an hour on."""
    import trio

    from actors.domain.model import TaskSpec
    from actors.domain.schedules import Schedule
    from actors.store.tasks import TaskStore

    store = TaskStore(redis_client, namespace, default_partitions=1)
    hourly = Schedule(
        "interval", every_s=3600, start_ms=await store.now_ms() + 3_600_000, overlap="buffer_one"
    )
    await store.create(TaskSpec("t", hourly, task_id="x"))
    first, queued = await store.trigger("x", "buffer_one")
    assert queued
    await trio.sleep(0.01)  # another due time (a trigger's is its time)
    second, queued = await store.trigger("x", "buffer_one")
    assert not queued  # waits behind the first
    await store.pause("x")
    scripts, keys = await store.scripts(), await store.keys()
    await scripts.end_flights([FlightEnd("x", ENDED_OK, int(first.split(":")[1]))])
    await store.resume("x")
    score = await redis_client.execute("ZSCORE", keys.schedule(0), "x")
    assert float(score) <= await store.now_ms()  # due now, not at its next grid time
    decided = await scripts.decide_overlaps("claim", {0: [Planned("x", "1", [])]})
    assert [d for d, _ in decided["x"].run] == [int(second.split(":")[1])]
    await scripts.confirm_flights("claim", ["x"])  # appended: its commit confirms it
    await store.pause("x")  # nothing waiting now, nothing unconfirmed: onto its grid
    await store.resume("x")
    score = await redis_client.execute("ZSCORE", keys.schedule(0), "x")
    assert float(score) > await store.now_ms() + 3_000_000


async def test_a_task_resumed_with_an_unconfirmed_fire_in_flight_is_claimed_at_once(
    redis_client: RedisClient, namespace: str
) -> None:
    """A poller put a fire in flight and died before its commit; the task was paused
    meanwhile. Resumed, it is due at once (its claim appends that fire again once its
    decider must be gone), not at its next grid time an hour on."""
    from actors.domain.model import TaskSpec
    from actors.domain.schedules import Schedule
    from actors.store.tasks import TaskStore

    store = TaskStore(redis_client, namespace, default_partitions=1)
    hourly = Schedule(
        "interval", every_s=3600, start_ms=await store.now_ms() + 3_600_000, overlap="skip"
    )
    await store.create(TaskSpec("t", hourly, task_id="x"))
    scripts, keys = await store.scripts(), await store.keys()
    await scripts.decide_overlaps("dead-claim", {0: [Planned("x", "S", [1000])]})
    await store.pause("x")
    await store.resume("x")
    score = await redis_client.execute("ZSCORE", keys.schedule(0), "x")
    assert float(score) <= await store.now_ms()


@pytest.mark.parametrize("window_s", [None, 0.05])
async def test_a_task_whose_grid_ended_while_paused_still_starts_its_waiting_fire(
    redis_client: RedisClient, namespace: str, window_s: float | None,
    log_lines: Callable[[], list[dict[str, Any]]],
) -> None:  # fmt: skip
    """A trigger waits behind the task's fire in flight (buffer_one); the task is paused,
    the fire ahead ends, and the task's last grid time passes meanwhile. Resumed, it stays
    active and due until its waiting fire starts (finished, it was out of the schedule for
    good and the fire waited for ever), then finishes; the grid time the pause skipped is
    not run. With a catch-up window shorter than the wait for its claim, the time it was
    parked on is not noted as an expired fire either (it is no grid time)."""
    import trio

    from actors.domain.model import TaskSpec
    from actors.domain.schedules import Schedule
    from actors.scheduling.poller import Poller, PollerSettings
    from actors.store.tasks import TaskStore
    from runtime.logging import get_logger

    store = TaskStore(redis_client, namespace, default_partitions=1)
    at = await store.now_ms() + 300
    once = Schedule("once", at_ms=at, overlap="buffer_one", catchup_window_s=window_s)
    await store.create(TaskSpec("t", once, task_id="x"))
    first, queued = await store.trigger("x", "buffer_one")
    assert queued
    await trio.sleep(0.01)  # another due time (a trigger's is its time)
    second, queued = await store.trigger("x", "buffer_one")
    assert not queued
    await store.pause("x")
    scripts, keys = await store.scripts(), await store.keys()
    await scripts.end_flights([FlightEnd("x", ENDED_OK, int(first.split(":")[1]))])
    await trio.sleep(max(0, at + 50 - await store.now_ms()) / 1000)  # its grid time passes
    assert await store.resume("x") == "active"
    await trio.sleep(0.2)  # longer than the catch-up window
    poller = Poller(store, PollerSettings())
    assert (await poller.tick(scripts, [0], get_logger())).enqueued == 1
    entries = await redis_client.execute("XRANGE", keys.queue("t"), "-", "+")
    due_times = [int(e[1][b"due_ms"]) for e in entries]
    assert due_times == [int(first.split(":")[1]), int(second.split(":")[1])]
    await scripts.end_flights([FlightEnd("x", ENDED_OK, int(second.split(":")[1]))])
    await poller.tick(scripts, [0], get_logger())
    assert [e for e in log_lines() if e["event"] == "not_run"] == []
    task = await store.get("x")
    assert task is not None and task.status == "finished"
    assert await redis_client.execute("HGET", keys.not_run(0), "x") is None


async def test_an_update_to_a_schedule_that_never_fires_still_starts_the_waiting_fire(
    redis_client: RedisClient, namespace: str, log_lines: Callable[[], list[dict[str, Any]]]
) -> None:
    """A trigger waits behind the task's fire in flight (buffer_one) when the task's
    schedule is replaced by one that never fires (its end passed). The task stays active
    and due until the waiting fire starts (finished, it was out of the schedule for good
    and the fire waited for ever), is parked while the fire ahead runs, is woken by its
    end, then finishes; the park time is no fire."""
    import trio

    from actors.domain.model import TaskSpec
    from actors.domain.schedules import Schedule
    from actors.scheduling.poller import Poller, PollerSettings
    from actors.store.tasks import TaskStore
    from runtime.logging import get_logger

    store = TaskStore(redis_client, namespace, default_partitions=1)
    now = await store.now_ms()
    hourly = Schedule("interval", every_s=3600, start_ms=now + 3_600_000, overlap="buffer_one")
    await store.create(TaskSpec("t", hourly, task_id="x"))
    first, queued = await store.trigger("x", "buffer_one")
    assert queued
    await trio.sleep(0.01)  # another due time (a trigger's is its time)
    second, queued = await store.trigger("x", "buffer_one")
    assert not queued
    ended = Schedule("interval", every_s=60, end_ms=now - 1000, overlap="buffer_one")
    assert await store.update("x", schedule=ended) == "active"
    scripts, keys = await store.scripts(), await store.keys()
    score = await redis_client.execute("ZSCORE", keys.schedule(0), "x")
    assert float(score) <= await store.now_ms()
    poller = Poller(store, PollerSettings())
    assert (await poller.tick(scripts, [0], get_logger())).enqueued == 0  # first still runs
    task = await store.get("x")
    assert task is not None and task.status == "active"
    await scripts.end_flights([FlightEnd("x", ENDED_OK, int(first.split(":")[1]))])
    score = await redis_client.execute("ZSCORE", keys.schedule(0), "x")
    assert float(score) <= await store.now_ms()  # woken by the end
    assert (await poller.tick(scripts, [0], get_logger())).enqueued == 1
    entries = await redis_client.execute("XRANGE", keys.queue("t"), "-", "+")
    due_times = [int(e[1][b"due_ms"]) for e in entries]
    assert due_times == [int(first.split(":")[1]), int(second.split(":")[1])]
    await scripts.end_flights([FlightEnd("x", ENDED_OK, int(second.split(":")[1]))])
    await poller.tick(scripts, [0], get_logger())
    assert [e for e in log_lines() if e["event"] == "not_run"] == []
    task = await store.get("x")
    assert task is not None and task.status == "finished"
    assert await redis_client.execute("ZSCORE", keys.schedule(0), "x") is None


async def _waiting_behind_a_trigger(store: Any) -> tuple[int, int]:
    """Task ``x`` (type ``t``, hourly from an hour on, buffer_one) with an operator's fire
    in flight and a second one waiting behind it: their due times."""
    import trio

    from actors.domain.model import TaskSpec
    from actors.domain.schedules import Schedule

    now = await store.now_ms()
    hourly = Schedule("interval", every_s=3600, start_ms=now + 3_600_000, overlap="buffer_one")
    await store.create(TaskSpec("t", hourly, task_id="x"))
    first, queued = await store.trigger("x", "buffer_one")
    assert queued
    await trio.sleep(0.01)  # another due time (a trigger's is its time)
    second, queued = await store.trigger("x", "buffer_one")
    assert not queued
    return int(first.split(":")[1]), int(second.split(":")[1])


async def test_an_update_to_no_policy_drops_the_waiting_fires_and_fires_nothing_more(
    redis_client: RedisClient, namespace: str
) -> None:
    """A task with a fire waiting behind its fire in flight gets a schedule that never fires
    and has no overlap policy: the waiting fire goes with the flight record (nothing would
    start it), and the task finishes, with no fire at a park time."""
    from actors.domain.schedules import Schedule
    from actors.scheduling.poller import Poller, PollerSettings
    from actors.store.tasks import TaskStore
    from runtime.logging import get_logger

    store = TaskStore(redis_client, namespace, default_partitions=1)
    await _waiting_behind_a_trigger(store)
    now = await store.now_ms()
    ended = Schedule("interval", every_s=60, end_ms=now - 1000)  # allow_all
    assert await store.update("x", schedule=ended) == "finished"
    scripts, keys = await store.scripts(), await store.keys()
    assert await redis_client.execute("HGET", keys.flights(0), "x") is None
    assert await redis_client.execute("ZSCORE", keys.schedule(0), "x") is None
    assert (await Poller(store, PollerSettings()).tick(scripts, [0], get_logger())).enqueued == 0
    assert len(await redis_client.execute("XRANGE", keys.queue("t"), "-", "+")) == 1


async def test_a_grid_that_ended_with_nothing_planned_still_starts_the_waiting_fire(
    redis_client: RedisClient, namespace: str
) -> None:
    """The new schedule's grid is all in the past and its misfire policy skips it: the claim
    plans no fire and ends the grid, with a fire waiting behind the one in flight. The task
    is parked until that fire starts (finished, it was out of the schedule, and the fire
    waited for ever), then finishes."""
    from actors.domain.schedules import Schedule
    from actors.scheduling.poller import Poller, PollerSettings
    from actors.store.tasks import TaskStore
    from runtime.logging import get_logger

    store = TaskStore(redis_client, namespace, default_partitions=1)
    first, second = await _waiting_behind_a_trigger(store)
    now = await store.now_ms()
    past = Schedule(
        "interval", every_s=1, start_ms=now - 5000, end_ms=now - 1000, overlap="buffer_one",
        misfire="skip",
    )  # fmt: skip
    assert await store.update("x", schedule=past) == "active"
    scripts, keys = await store.scripts(), await store.keys()
    poller = Poller(store, PollerSettings())
    assert (await poller.tick(scripts, [0], get_logger())).enqueued == 0
    task = await store.get("x")
    assert task is not None and task.status == "active"
    await scripts.end_flights([FlightEnd("x", ENDED_OK, first)])
    assert (await poller.tick(scripts, [0], get_logger())).enqueued == 1
    entries = await redis_client.execute("XRANGE", keys.queue("t"), "-", "+")
    assert [int(e[1][b"due_ms"]) for e in entries] == [first, second]
    await scripts.end_flights([FlightEnd("x", ENDED_OK, second)])
    await poller.tick(scripts, [0], get_logger())
    task = await store.get("x")
    assert task is not None and task.status == "finished"


async def test_a_new_schedule_keeps_a_task_woken_for_its_waiting_fire_due_now(
    redis_client: RedisClient, namespace: str
) -> None:
    """The fire ahead ended and woke the task (due now) for the fire waiting behind it; an
    update gives it a new schedule before its claim. It stays due now: the waiting fire is
    not held back until the new grid's first time, a day on."""
    from actors.domain.schedules import Schedule
    from actors.scheduling.poller import Poller, PollerSettings
    from actors.store.tasks import TaskStore
    from runtime.logging import get_logger

    store = TaskStore(redis_client, namespace, default_partitions=1)
    first, second = await _waiting_behind_a_trigger(store)
    scripts, keys = await store.scripts(), await store.keys()
    await scripts.end_flights([FlightEnd("x", ENDED_OK, first)])
    now = await store.now_ms()
    daily = Schedule("interval", every_s=86400, start_ms=now + 86_400_000, overlap="buffer_one")
    assert await store.update("x", schedule=daily) == "active"
    score = await redis_client.execute("ZSCORE", keys.schedule(0), "x")
    assert float(score) <= await store.now_ms()
    assert (await Poller(store, PollerSettings()).tick(scripts, [0], get_logger())).enqueued == 1
    entries = await redis_client.execute("XRANGE", keys.queue("t"), "-", "+")
    assert [int(e[1][b"due_ms"]) for e in entries] == [first, second]
    task = await store.get("x")
    assert task is not None and task.next_run_ms == now + 86_400_000


@pytest.mark.parametrize("woken", [True, False], ids=["woken", "parked"])
async def test_a_claim_planning_no_time_of_its_own_leaves_an_unconfirmed_fire_to_its_decider(
    scripts: Scripts, woken: bool
) -> None:
    """A fire another decider put in flight, unconfirmed and within the takeover time, and
    a claim that plans no time (woken before its grid time) or only ends the grid (parked):
    the claim waits, as one that plans the fire's own time does. Deciding then, it
    appended nothing and left the task on its grid (or finished it), so the fire was never
    appended if its decider had died."""
    await _exists(scripts, "t")
    dead = await scripts.decide_overlaps(
        "dead-claim", {0: [Planned("t", "S", [1000, 2000])]}, takeover_ms=60_000
    )
    assert dead["t"].run == [(1000, True)] and dead["t"].skipped == [2000]
    # woken: planned before its next grid time; parked: on the latest grid time decided
    planned = Planned("t", "S", []) if woken else Planned("t", "S", [2000], ends=True)
    held = await scripts.decide_overlaps("claim-2", {0: [planned]}, takeover_ms=60_000)
    assert held["t"].wait_ms is not None and held["t"].run == []
    late = await scripts.decide_overlaps("claim-3", {0: [planned]}, takeover_ms=0)
    assert late["t"].wait_ms is None and late["t"].run == [(1000, False)]


async def test_a_trigger_decided_between_a_claim_and_its_commit_keeps_the_finishing_task(
    redis_client: RedisClient, namespace: str
) -> None:
    """A task's last grid fire is decided (nothing waiting: the grid ends) and an operator's
    trigger decides to wait behind it before the claim's commit. The commit keeps the task
    active and due (finished, it was out of the schedule and the trigger waited for ever);
    the trigger starts when the fire ahead ends, then the task finishes."""
    import trio

    from actors.domain.model import TaskSpec
    from actors.domain.schedules import Schedule
    from actors.scheduling.poller import Poller, PollerSettings
    from actors.store.tasks import TaskStore
    from runtime.logging import get_logger

    store = TaskStore(redis_client, namespace, default_partitions=1)
    once = Schedule("once", at_ms=await store.now_ms(), overlap="buffer_one")
    await store.create(TaskSpec("t", once, task_id="x"))
    scripts, keys = await store.scripts(), await store.keys()
    poller = Poller(store, PollerSettings())
    commit = poller._enqueue_and_commit
    triggered: list[str] = []

    async def trigger_then_commit(*args: Any) -> Any:
        await trio.sleep(0.01)  # another due time than the grid's
        sid, queued = await store.trigger("x", "buffer_one")
        assert not queued  # waits behind the grid fire, decided but not yet committed
        triggered.append(sid)
        return await commit(*args)

    poller._enqueue_and_commit = trigger_then_commit  # type: ignore[method-assign,assignment]
    assert (await poller.tick(scripts, [0], get_logger())).enqueued == 1
    poller._enqueue_and_commit = commit  # type: ignore[method-assign]
    task = await store.get("x")
    assert task is not None and task.status == "active"
    grid_due = int(
        (await redis_client.execute("XRANGE", keys.queue("t"), "-", "+"))[0][1][b"due_ms"]
    )
    await scripts.end_flights([FlightEnd("x", ENDED_OK, grid_due)])
    assert (await poller.tick(scripts, [0], get_logger())).enqueued == 1
    entries = await redis_client.execute("XRANGE", keys.queue("t"), "-", "+")
    assert [int(e[1][b"due_ms"]) for e in entries] == [grid_due, int(triggered[0].split(":")[1])]
    await scripts.end_flights([FlightEnd("x", ENDED_OK, int(triggered[0].split(":")[1]))])
    await poller.tick(scripts, [0], get_logger())
    task = await store.get("x")
    assert task is not None and task.status == "finished"


async def test_an_operators_fire_decided_after_the_task_finished_is_not_held(
    redis_client: RedisClient, namespace: str
) -> None:
    """A trigger read the task active; its last grid fire was committed (the task finished,
    out of the schedule) before the trigger's decision. The trigger is not run (skipped
    behind the fire in flight), not left waiting for a claim that never comes."""
    from actors.domain.model import TaskSpec
    from actors.domain.schedules import Schedule
    from actors.scheduling.poller import Poller, PollerSettings
    from actors.store.manual_fires import MANUAL_TOKEN
    from actors.store.tasks import TaskStore
    from runtime.logging import get_logger

    store = TaskStore(redis_client, namespace, default_partitions=1)
    once = Schedule("once", at_ms=await store.now_ms(), overlap="buffer_one")
    await store.create(TaskSpec("t", once, task_id="x"))
    scripts = await store.scripts()
    assert (await Poller(store, PollerSettings()).tick(scripts, [0], get_logger())).enqueued == 1
    task = await store.get("x")
    assert task is not None and task.status == "finished"
    late = await store.now_ms() + 5
    decided = await scripts.decide_overlaps(
        f"{MANUAL_TOKEN}1", {0: [Planned("x", "1", [late])]}, grid=False
    )
    assert decided["x"].run == [] and decided["x"].skipped == [late]
    assert (await _record(scripts, "x"))[3] == ""  # nothing waiting


async def test_a_task_whose_grid_ended_while_paused_keeps_its_unconfirmed_fire(
    redis_client: RedisClient, namespace: str
) -> None:
    """A poller put the task's last grid fire in flight and died before its append and
    commit; the task was paused, and its grid time passed. Resumed, it stays active and
    due (finished, no claim would ever append that fire), and a claim past the takeover
    time appends it."""
    import trio

    from actors.domain.model import TaskSpec
    from actors.domain.schedules import Schedule
    from actors.store.tasks import TaskStore

    store = TaskStore(redis_client, namespace, default_partitions=1)
    at = await store.now_ms() + 300
    await store.create(TaskSpec("t", Schedule("once", at_ms=at, overlap="skip"), task_id="x"))
    scripts, keys = await store.scripts(), await store.keys()
    await scripts.decide_overlaps("dead-claim", {0: [Planned("x", "S", [at])]})
    await store.pause("x")
    await trio.sleep(max(0, at + 50 - await store.now_ms()) / 1000)
    assert await store.resume("x") == "active"
    score = await redis_client.execute("ZSCORE", keys.schedule(0), "x")
    assert float(score) <= await store.now_ms()
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
    from actors.domain.model import TaskSpec
    from actors.domain.schedules import Schedule
    from actors.scheduling.poller import Poller, PollerSettings
    from actors.store.tasks import TaskStore
    from runtime.logging import get_logger

    store = TaskStore(redis_client, namespace, default_partitions=1)
    now = await store.now_ms()
    for task_id, at in (("x", now), ("y", now + 300)):
        await store.create(TaskSpec("t", Schedule("once", at_ms=at), task_id=task_id))
    scripts, keys = await store.scripts(), await store.keys()
    for task_id in ("x", "y"):
        await scripts.decide_overlaps(
            f"{MANUAL_TOKEN}dead", {0: [Planned(task_id, "S", [now - 1000])]}, grid=False
        )
    await store.pause("y")
    poller = Poller(store, PollerSettings())
    assert (await poller.tick(scripts, [0], get_logger())).enqueued == 1
    for _ in range(3):
        assert (await poller.tick(scripts, [0], get_logger())).enqueued == 0
    task = await store.get("x")
    assert task is not None and task.status == "finished"
    assert len(await redis_client.execute("XRANGE", keys.queue("t"), "-", "+")) == 1
    await trio_sleep_until(store, now + 350)
    assert await store.resume("y") == "finished"


async def trio_sleep_until(store: Any, at_ms: int) -> None:
    import trio

    await trio.sleep(max(0, at_ms - await store.now_ms()) / 1000)


async def test_a_backfill_decided_after_the_task_finished_holds_nothing_back(
    redis_client: RedisClient, namespace: str
) -> None:
    """A buffer_one backfill of two times read the task active; its last grid fire was
    committed and ended before the backfill's decision. The first time starts; the second
    is not run, not left waiting behind it on a task no claim takes again."""
    from actors.domain.model import TaskSpec
    from actors.domain.schedules import Schedule
    from actors.scheduling.poller import Poller, PollerSettings
    from actors.store.tasks import TaskStore
    from runtime.logging import get_logger

    store = TaskStore(redis_client, namespace, default_partitions=1)
    now = await store.now_ms()
    await store.create(
        TaskSpec("t", Schedule("once", at_ms=now, overlap="buffer_one"), task_id="x")
    )
    scripts = await store.scripts()
    assert (await Poller(store, PollerSettings()).tick(scripts, [0], get_logger())).enqueued == 1
    await scripts.end_flights([FlightEnd("x", ENDED_OK, now)])
    task = await store.get("x")
    assert task is not None and task.status == "finished"
    decided = await scripts.decide_overlaps(
        f"{MANUAL_TOKEN}1", {0: [Planned("x", "1", [now - 2000, now - 1000])]}, grid=False
    )
    assert decided["x"].run == [(now - 2000, True)] and decided["x"].skipped == [now - 1000]
    assert (await _record(scripts, "x"))[3] == ""  # nothing waiting


async def test_a_woken_task_waits_for_another_deciders_fire_no_later_than_its_grid_time(
    redis_client: RedisClient, namespace: str
) -> None:
    """The end of a fire woke the task for the fire waiting behind it, and an operator's
    call started that fire but has not confirmed it yet when the poller claims the task.
    The claim waits for that call, but no longer than the task's next grid time: that
    time is claimed when it comes, not a claim lease late."""
    import trio

    from actors.domain.model import TaskSpec
    from actors.domain.schedules import Schedule
    from actors.scheduling.poller import Poller, PollerSettings
    from actors.store.tasks import TaskStore
    from runtime.logging import get_logger

    store = TaskStore(redis_client, namespace, default_partitions=1)
    now = await store.now_ms()
    due = now + 10_000
    hourly = Schedule("interval", every_s=3600, start_ms=due, overlap="buffer_one")
    await store.create(TaskSpec("t", hourly, task_id="x"))
    first, queued = await store.trigger("x", "buffer_one")
    await trio.sleep(0.01)
    _, queued = await store.trigger("x", "buffer_one")
    assert not queued
    scripts, keys = await store.scripts(), await store.keys()
    await scripts.end_flights([FlightEnd("x", ENDED_OK, int(first.split(":")[1]))])
    started = await scripts.decide_overlaps(
        f"{MANUAL_TOKEN}slow", {0: [Planned("x", "1", [])]}, grid=False, takeover_ms=60_000
    )
    assert len(started["x"].run) == 1  # the waiting fire, in flight, not yet confirmed
    poller = Poller(store, PollerSettings(claim_lease_ms=60_000))
    assert (await poller.tick(scripts, [0], get_logger())).enqueued == 0
    score = await redis_client.execute("ZSCORE", keys.schedule(0), "x")
    assert float(score) < due + 30_000  # about its grid time (the commit's clock), not a lease on
