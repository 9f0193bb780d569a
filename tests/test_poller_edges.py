"""The poller's edges against a real Redis: a commit sent again after its reply was lost."""

from __future__ import annotations

from collections import defaultdict

from actors.domain.model import TaskSpec
from actors.domain.schedules import Schedule
from actors.store.replies import Fire, FireCommit, fire_commit, held_commit
from actors.store.tasks import TaskStore
from runtime.redis_io import RedisClient


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
