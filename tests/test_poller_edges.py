"""The poller's edges against a real Redis: a commit sent again after its reply was lost."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trio

from actors.domain.model import TaskSpec
from actors.domain.schedules import Overlap, Schedule
from actors.scheduling.poller import Poller, PollerSettings
from actors.store.flights import Decision, Planned
from actors.store.replies import Fire, FireCommit, fire_commit, held_commit
from actors.store.scripts import Scripts
from actors.store.tasks import TaskStore
from runtime.logging import get_logger
from runtime.redis_io import RedisClient
from tests.test_poller import stream_fires
from tests.waiting import eventually


async def test_a_commit_sent_again_after_its_reply_was_lost_loses_nothing(
    redis_client: RedisClient, namespace: str
) -> None:
    """The commit ran (the claim is no longer in flight), its reply was lost, and the
    poller sends it again: the tasks it moved are not lost, and the partition's earliest
    due time is known (a lost claim would make the poller forget the partition's states
    and skip it until its next full look)."""
    store = TaskStore(redis_client, namespace, default_partitions=1)
    past = await store.now_ms() - 10
    ids = ["a", "b", "c"]
    every = Schedule("interval", every_s=60, start_ms=past)
    await store.create_many([TaskSpec("t", every, task_id=i) for i in ids])
    scripts = await store.scripts()
    (claim,) = await scripts.claim_due([0], "p1", "tok-1", 100, 10_000)
    await scripts.enqueue(
        [Fire(t.task_id, "t", t.payload, past, prior=t.prior_claim) for t in claim.tasks],
        claim.now_ms, 60_000, "tok-1",
    )  # fmt: skip
    commits: dict[int, list[FireCommit]] = defaultdict(list)
    for task in claim.tasks:
        commits[0].append(fire_commit(task, past + 60_000, past + 60_000, 1))
    first = await scripts.commit_fires("p1", "tok-1", commits, {0: claim.writes})
    again = await scripts.commit_fires("p1", "tok-1", commits, {0: claim.writes})
    assert first[0].lost == [] and first[0].earliest_ms == past + 60_000
    assert again[0].lost == []
    assert again[0].earliest_ms == past + 60_000
    for stored in await store.get_many(ids):
        assert stored is not None and (stored.next_run_ms, stored.fires) == (past + 60_000, 1)


async def test_a_commit_of_a_claim_taken_over_still_loses_what_it_did_not_write(
    redis_client: RedisClient, namespace: str
) -> None:
    """Fencing holds: another poller took the partition over, so a stale claim's commit
    changes nothing and reports every task it did not itself commit as lost."""
    store = TaskStore(redis_client, namespace, default_partitions=1)
    past = await store.now_ms() - 10
    await store.create(TaskSpec("t", Schedule("interval", every_s=60, start_ms=past), task_id="a"))
    scripts = await store.scripts()
    (claim,) = await scripts.claim_due([0], "p1", "tok-1", 100, 10)
    commits = {0: [fire_commit(t, past + 60_000, past + 60_000, 1) for t in claim.tasks]}
    (taken,) = await scripts.claim_due([0], "p2", "tok-2", 100, 10_000, take_from={0: "p1"})
    assert not taken.held
    stale = await scripts.commit_fires("p1", "tok-1", commits, {0: claim.writes})
    assert stale[0].lost == ["a"]
    stored = await store.get("a")
    assert stored is not None and (stored.next_run_ms, stored.fires) == (past, 0)


async def test_a_held_commit_that_keeps_its_claim_sent_again_loses_nothing(
    redis_client: RedisClient, namespace: str
) -> None:
    """A held task's type needed several enqueue calls ('*'): the claim stays in flight,
    for the task's next claim to find what an earlier call appended. Its fire waits a hold
    on, its grid unmoved; the tasks committed beside it move on. Sent again after its reply
    was lost, with an API write to the partition between, the commit finds the states it
    wrote and reports nothing lost."""
    store = TaskStore(redis_client, namespace, default_partitions=1)
    past = await store.now_ms() - 10
    every = Schedule("interval", every_s=60, start_ms=past)
    await store.create_many([TaskSpec("t", every, task_id=i) for i in ["a", "b", "c"]])
    scripts = await store.scripts()
    (claim,) = await scripts.claim_due([0], "p1", "tok-1", 100, 10_000)
    moving = [t for t in claim.tasks if t.task_id != "a"]
    await scripts.enqueue(
        [Fire(t.task_id, "t", t.payload, past, prior=t.prior_claim) for t in moving],
        claim.now_ms, 60_000, "tok-1",
    )  # fmt: skip
    (held,) = [t for t in claim.tasks if t.task_id == "a"]
    commits = {
        0: [held_commit(held, 5000, keep=True)]
        + [fire_commit(t, past + 60_000, past + 60_000, 1) for t in moving]
    }
    first = await scripts.commit_fires("p1", "tok-1", commits, {0: claim.writes})
    assert first[0].lost == []
    owner = scripts.keys.partition_owner(0)
    inflight = (await redis_client.execute("HGET", owner, "inflight")).decode()
    assert "tok-1:" in inflight  # kept in flight
    seconds, micros = await redis_client.execute("TIME")
    now = int(seconds) * 1000 + int(micros) // 1000
    score = float(await redis_client.execute("ZSCORE", scripts.keys.schedule(0), "a"))
    assert now < score <= now + 5000
    await store.create(TaskSpec("t", every, task_id="d"))  # an API write between
    again = await scripts.commit_fires("p1", "tok-1", commits, {0: claim.writes})
    assert again[0].lost == []
    a, b, c = await store.get_many(["a", "b", "c"])
    assert a is not None and (a.next_run_ms, a.fires) == (past, 0)
    for moved in (b, c):
        assert moved is not None and (moved.next_run_ms, moved.fires) == (past + 60_000, 1)


@pytest.mark.parametrize("one_shot", [False, True])
async def test_a_fire_a_dead_claim_put_in_flight_runs_before_the_grid_moves_past_it(
    redis_client: RedisClient, namespace: str, one_shot: bool
) -> None:
    """A poller decided a skip task's grid time (in flight, unconfirmed) and died before
    its append; another poller takes the partition over while that decider might still be
    on its way to the append (within the claim lease). It must neither append the fire
    now (the decider's copy could land too) nor move the grid past it (a one-shot task's
    only fire would never be appended; a periodic task's would wait a whole period, and
    its next time be skipped behind it): the task waits, and the fire is appended once
    the decider must be gone."""
    store = TaskStore(redis_client, namespace, default_partitions=1)
    due = await store.now_ms() - 10
    schedule = (
        Schedule("once", at_ms=due, overlap="skip")
        if one_shot
        else Schedule("interval", every_s=60, start_ms=due, overlap="skip")
    )
    await store.create(TaskSpec("t", schedule, task_id="h"))
    scripts = await store.scripts()
    (claim,) = await scripts.claim_due([0], "dead", "tok-1", 100, 100)
    assert [t.task_id for t in claim.tasks] == ["h"]
    decided = await scripts.decide_overlaps("tok-1", {0: [Planned("h", "S", [due], task_type="t")]})
    assert decided["h"].run == [(due, True)]
    await trio.sleep(0.2)  # the dead poller's lease has ended
    poller = Poller(store, PollerSettings(claim_lease_ms=5000))
    await poller.tick(scripts, [0], get_logger())  # within the takeover: the task waits
    assert poller.owned == {0}  # the partition taken over, the task claimed
    assert await stream_fires(store, "t") == []
    waiting = await store.get("h")
    assert waiting is not None and (waiting.next_run_ms, waiting.fires) == (due, 0)

    async def appended() -> bool:
        await poller.tick(scripts, [0], get_logger())
        return bool(await stream_fires(store, "t"))

    await eventually(appended, poll_s=0.1)
    for _ in range(3):
        await poller.tick(scripts, [0], get_logger())
    assert [f["schedule_id"] for f in await stream_fires(store, "t")] == [f"h:{due}"]
    stored = await store.get("h")
    assert stored is not None and stored.fires == 1
    if one_shot:
        assert stored.status == "finished"
    else:
        assert stored.next_run_ms == due + 60_000
    keys = await store.keys()
    assert await redis_client.execute("HGET", keys.not_run(0), "h") is None  # none skipped


async def test_a_held_task_lost_to_an_api_write_leaves_its_fire_to_the_next_decision(
    redis_client: RedisClient, namespace: str
) -> None:
    """A skip task's type is held back (its stream rejected) after its claim put a fire in
    flight; an API write changes the task before the commit, so the commit loses it. The
    fire was never appended and its claim is over: the task's next decision appends it at
    once, not a claim lease later (meanwhile the grid could be decided past it)."""
    store = TaskStore(redis_client, namespace, default_partitions=1)
    due = await store.now_ms() - 10
    every = Schedule("interval", every_s=60, start_ms=due, overlap="skip")
    await store.create(TaskSpec("t", every, task_id="h"))
    scripts = await store.scripts()
    (claim,) = await scripts.claim_due([0], "p1", "tok-1", 100, 10_000)
    (task,) = claim.tasks
    planned = {0: [Planned("h", "S", [due], task_type="t")]}
    decided = await scripts.decide_overlaps("tok-1", planned, takeover_ms=10_000)
    assert decided["h"].run == [(due, True)]
    await store.update("h", payload={"v": 2})
    done = await scripts.commit_fires(
        "p1", "tok-1", {0: [held_commit(task, 10_000)]}, {0: claim.writes}
    )
    assert done[0].lost == ["h"]
    again = await scripts.decide_overlaps("tok-2", planned, takeover_ms=10_000)
    assert again["h"].run == [(due, False)] and again["h"].wait_ms is None


@pytest.mark.parametrize(("takeover_ms", "appended"), [(60_000, 0), (0, 1)])
async def test_an_operators_trigger_leaves_a_pollers_fire_for_the_configured_claim_lease(
    redis_client: RedisClient, namespace: str, takeover_ms: int, appended: int
) -> None:
    """A poller put a skip task's fire in flight and is on its way to its append. An
    operator's trigger meanwhile leaves it to that poller for the pollers' claim lease as
    configured (``TaskStore.takeover_ms``, from ``[scheduler] claim_lease_ms``), not a
    fixed default: appending it too would run it twice. Past it (here: at once), the
    poller is taken as dead and the trigger appends the fire again."""
    store = TaskStore(redis_client, namespace, default_partitions=1, takeover_ms=takeover_ms)
    due = await store.now_ms() - 10
    every = Schedule("interval", every_s=60, start_ms=due, overlap="skip")
    await store.create(TaskSpec("t", every, task_id="h"))
    scripts = await store.scripts()
    decided = await scripts.decide_overlaps("claim", {0: [Planned("h", "S", [due], task_type="t")]})
    assert decided["h"].run == [(due, True)]
    _, queued = await store.trigger("h", "skip")
    assert not queued  # skipped behind the poller's fire either way
    assert [f["schedule_id"] for f in await stream_fires(store, "t")] == [f"h:{due}"] * appended


async def test_a_commit_that_parked_a_finishing_task_sent_again_loses_nothing(
    redis_client: RedisClient, namespace: str
) -> None:
    """A commit ends a task's grid while an operator's fire waits behind its fire in flight,
    so it parks the task (active, due now) rather than finishing it; its reply is lost and
    the poller sends it again. The parked state is the one that commit wrote: the task is
    not reported lost, and it stays parked."""
    store = TaskStore(redis_client, namespace, default_partitions=1)
    past = await store.now_ms() - 10
    once = Schedule("once", at_ms=past, overlap="buffer_one")
    await store.create(TaskSpec("t", once, task_id="x"))
    scripts = await store.scripts()
    (claim,) = await scripts.claim_due([0], "p1", "tok-1", 100, 10_000)
    decided = await scripts.decide_overlaps("tok-1", {0: [Planned("x", "1", [past], ends=True)]})
    assert decided["x"].run == [(past, True)]
    _, queued = await store.trigger("x", "buffer_one")
    assert not queued  # waits behind the grid fire, decided and not yet committed
    (task,) = claim.tasks
    await scripts.enqueue([Fire("x", "t", task.payload, past, prior=task.prior_claim)],
                          claim.now_ms, 60_000, "tok-1")  # fmt: skip
    commit = fire_commit(task, None, None, 1)
    commit.confirm = True
    first = await scripts.commit_fires("p1", "tok-1", {0: [commit]}, {0: claim.writes})
    again = await scripts.commit_fires("p1", "tok-1", {0: [commit]}, {0: claim.writes})
    assert first[0].lost == [] and again[0].lost == []
    stored = await store.get("x")
    assert stored is not None and stored.status == "active" and stored.next_run_ms == past


async def test_fires_a_claim_made_before_a_pause_are_counted_against_max_runs(
    redis_client: RedisClient, namespace: str
) -> None:
    """A claim enqueues a task's last fire under ``max_runs``; the task is paused before
    the commit, which loses it to the pause. That fire is in the stream and runs: it is
    counted all the same, so the task resumed fires no more (it ran one more than
    ``max_runs`` allows, uncounted)."""
    store = TaskStore(redis_client, namespace, default_partitions=1)
    due = await store.now_ms() - 10
    once_more = Schedule("interval", every_s=60, start_ms=due, max_runs=1)
    await store.create(TaskSpec("t", once_more, task_id="m"))
    scripts = await store.scripts()
    (claim,) = await scripts.claim_due([0], "p1", "tok-1", 100, 10_000)
    (task,) = claim.tasks
    assert await store.pause("m") == "paused"
    done = await scripts.commit_fires(
        "p1", "tok-1", {0: [fire_commit(task, None, None, 1)]}, {0: claim.writes}
    )
    assert done[0].lost == ["m"]
    paused = await store.get("m")
    assert paused is not None and (paused.status, paused.fires, paused.next_run_ms) == (
        "paused", 1, due,
    )  # fmt: skip
    await store.resume("m")
    poller = Poller(store, PollerSettings())
    await poller.tick(scripts, [0], get_logger())
    assert await stream_fires(store, "t") == []  # nothing more enqueued (none was here)
    resumed = await store.get("m")
    assert resumed is not None and (resumed.status, resumed.fires) == ("finished", 1)


class _WriteBeforeDecision(Scripts):
    """The poller's scripts, with an API write made once between a claim and its overlap
    decision (an operator's update landing in that window)."""

    def __init__(self, scripts: Scripts, write: Callable[[], Awaitable[object]]) -> None:
        super().__init__(scripts.client, scripts.keys)
        self._write: Callable[[], Awaitable[object]] | None = write

    async def decide_overlaps(self, *args: Any, **kwargs: Any) -> dict[str, Decision]:
        if self._write is not None:
            write, self._write = self._write, None
            await write()
        return await super().decide_overlaps(*args, **kwargs)


async def _due_times(store: TaskStore, task_type: str) -> list[int]:
    return [int(f["due_ms"]) for f in await stream_fires(store, task_type)]


async def test_a_task_updated_between_its_claim_and_decision_runs_its_new_schedule(
    redis_client: RedisClient, namespace: str
) -> None:
    """A skip task claimed on its grid, then updated to a one-shot before the claim's
    overlap decision: the old schedule's decision is not written over the flight record
    the update reset (its grid time would count as decided, and the one-shot, earlier,
    would never run nor be said not run); the one-shot runs."""
    store = TaskStore(redis_client, namespace, default_partitions=1)
    start = await store.now_ms() - 10
    await store.create(
        TaskSpec("t", Schedule("interval", every_s=60, start_ms=start, overlap="skip"), task_id="s")
    )
    once_at = start - 1000
    one_shot = Schedule("once", at_ms=once_at, overlap="skip")
    scripts = await store.scripts()
    poller = Poller(store, PollerSettings())
    racing = _WriteBeforeDecision(scripts, lambda: store.update("s", schedule=one_shot))
    await poller.tick(racing, [0], get_logger())
    assert await _due_times(store, "t") == []  # the old grid time: not decided
    for _ in range(3):
        await poller.tick(scripts, [0], get_logger())
        if await _due_times(store, "t"):
            break
        await trio.sleep(0.01)
    assert await _due_times(store, "t") == [once_at]


async def test_a_policy_changed_to_allow_all_between_claim_and_decision_leaves_none_waiting(
    redis_client: RedisClient, namespace: str
) -> None:
    """A buffer_all task claimed for three missed times, changed to allow_all on the same
    grid before the decision: no flight record of the old policy is written (it would
    hold two fires waiting that allow_all runs anyway, to start again once the task is
    back on a tracked policy); each time runs once."""
    store = TaskStore(redis_client, namespace, default_partitions=1)
    start = await store.now_ms() - 2500

    def every(overlap: Overlap) -> Schedule:
        return Schedule("interval", every_s=1, start_ms=start, overlap=overlap, misfire="fire_all")

    await store.create(TaskSpec("t", every("buffer_all"), task_id="b"))
    scripts = await store.scripts()
    poller = Poller(store, PollerSettings())
    racing = _WriteBeforeDecision(scripts, lambda: store.update("b", schedule=every("allow_all")))
    await poller.tick(racing, [0], get_logger())
    keys = scripts.keys
    assert await redis_client.execute("HGET", keys.flights(0), "b") is None
    await poller.tick(scripts, [0], get_logger())
    dues = await _due_times(store, "t")
    assert dues[:3] == [start, start + 1000, start + 2000]
    assert len(dues) == len(set(dues))
