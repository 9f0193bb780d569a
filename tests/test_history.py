"""The occurrence ledger end to end: each fire's fate in its task's history, written by the
scripts that decide it (a real Redis, a node's tree in-process, real handlers), and the
attention list those writes keep."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest

from actors.config import ConsumerSection
from actors.domain.errors import TaskNotFound
from actors.domain.model import TaskSpec
from actors.domain.schedules import Schedule
from actors.store.flights import Planned
from actors.store.history import Ledger, decode_ring
from actors.store.ledger import acknowledge, attention_counts, attention_page, task_history
from actors.store.replies import OutcomeWrite
from actors.store.tasks import TaskStore
from runtime.redis_io import RedisClient
from tests.execution_harness import node_config, running_node, wait_until


@pytest.fixture
def store(redis_client: RedisClient, namespace: str) -> TaskStore:
    return TaskStore(redis_client, namespace, default_partitions=4)


async def _task(store: TaskStore, every_s: float, start_in_ms: int = 300, **extra: Any) -> str:
    start_ms = await store.now_ms() + start_in_ms
    schedule = Schedule("interval", every_s=every_s, start_ms=start_ms, **extra)
    (created,) = await store.create_many([TaskSpec("work", schedule, {"sleep_s": 0.01})])
    return created.task_id


def _node(url: str, namespace: str, tmp_path: Path, handler: str, **section: Any) -> Any:
    consumers = {"work": ConsumerSection(f"tests.handlers.jobs:{handler}", **section)}
    return running_node(node_config(url, namespace, tmp_path, consumers))


async def _history_of(store: TaskStore, task_id: str, n: int) -> list[Any]:
    found: list[Any] = []

    async def enough() -> bool:
        found[:] = await task_history(store, task_id)
        return len(found) >= n

    await wait_until(enough)
    return found


async def test_each_fire_is_an_occurrence_with_its_times_and_node(
    store: TaskStore, redis_url: str, namespace: str, tmp_path: Path
) -> None:
    task_id = await _task(store, 0.2)
    async with _node(redis_url, namespace, tmp_path, "sleepy"):
        history = await _history_of(store, task_id, 4)
        await store.trigger(task_id)
        await wait_until(
            lambda: _any_origin(store, task_id, "trigger"),
        )
    history = await task_history(store, task_id)
    ran = [o for o in history if o.fate == "ok"]  # a loaded machine may coalesce some
    assert all(o.node == "n1" and o.attempt == 0 for o in ran)
    assert {o.origin for o in ran} == {"schedule", "trigger"}
    dues = [o.due_ms for o in ran if o.origin == "schedule"]
    assert dues == sorted(dues, reverse=True), "newest first"
    assert all((a - b) % 200 == 0 for a, b in itertools.pairwise(dues))
    for o in ran:
        assert o.started_ms is not None and o.finished_ms is not None
        assert o.started_ms >= o.due_ms and o.finished_ms >= o.started_ms
    assert (await attention_page(store))[0] == []


async def _any_origin(store: TaskStore, task_id: str, origin: str) -> bool:
    return any(o.origin == origin for o in await task_history(store, task_id))


async def test_failures_retries_and_dead_put_the_task_on_the_attention_list(
    store: TaskStore, redis_url: str, namespace: str, tmp_path: Path
) -> None:
    task_id = await _task(store, 3600)
    section = {"max_attempts": 2, "backoff_base_s": 0.05, "backoff_jitter": 0.0}
    async with _node(redis_url, namespace, tmp_path, "failing", **section):
        history = await _history_of(store, task_id, 2)
    assert [(o.fate, o.attempt) for o in history] == [("dead", 1), ("failed", 0)]
    assert history[0].error == "RuntimeError: boom on attempt 1"
    assert history[1].error == "RuntimeError: boom on attempt 0"
    assert history[0].due_ms == history[1].due_ms
    entries, cursor = await attention_page(store)
    assert cursor is None
    assert [(e.task_id, e.type, e.reason) for e in entries] == [(task_id, "work", "dead")]
    assert entries[0].error == "RuntimeError: boom on attempt 1"
    assert await attention_counts(store) == {("work", "dead"): 1}
    assert (await attention_page(store, reason="late"))[0] == []
    assert (await attention_page(store, task_type="other"))[0] == []

    removed = await acknowledge(store, task_id, "known outage", "ops", 1)
    assert removed is not None and removed.reason == "dead"
    assert (await attention_page(store))[0] == []
    assert await attention_counts(store) == {("work", "dead"): 0}
    assert await acknowledge(store, task_id, None, None, 2) is None
    await store.delete(task_id)
    with pytest.raises(TaskNotFound):
        await task_history(store, task_id)
    with pytest.raises(TaskNotFound):
        await acknowledge(store, task_id, None, None, 3)
    keys = await store.keys()
    p = keys.partition_of(task_id)
    assert await store.client.execute("HGET", keys.history(p), task_id) is None
    assert await store.client.execute("HGET", keys.history_errors(p), task_id) is None


async def test_skipped_fires_under_skip_are_occurrences(
    store: TaskStore, redis_url: str, namespace: str, tmp_path: Path
) -> None:
    start_ms = await store.now_ms() + 300
    schedule = Schedule("interval", every_s=0.3, start_ms=start_ms, overlap="skip")
    (created,) = await store.create_many([TaskSpec("work", schedule, {"sleep_s": 1.2})])
    task_id = created.task_id

    async def skipped_then_ok() -> bool:
        fates = [o.fate for o in await task_history(store, task_id)]
        return "skipped" in fates and "ok" in fates

    async with _node(redis_url, namespace, tmp_path, "sleepy", concurrency=5):
        await wait_until(skipped_then_ok)
        skipped = [o for o in await task_history(store, task_id) if o.fate == "skipped"]
        assert all(o.reason == "overlap" and o.started_ms is None for o in skipped)
        await wait_until(lambda: _on_list(store, task_id, "skipped"))


async def _on_list(store: TaskStore, task_id: str, reason: str) -> bool:
    entries, _ = await attention_page(store)
    return any(e.task_id == task_id and e.reason == reason for e in entries)


async def test_missed_grid_times_are_one_coalesced_occurrence(
    store: TaskStore, redis_url: str, namespace: str, tmp_path: Path
) -> None:
    task_id = await _task(store, 1, start_in_ms=-10_500)  # ten grid times passed
    async with _node(redis_url, namespace, tmp_path, "sleepy"):
        history = await _history_of(store, task_id, 2)
    assert history[-1].fate == "coalesced"
    assert history[-2].fate == "ok" and history[-2].due_ms > history[-1].due_ms


async def test_the_ring_stays_bounded_and_lateness_comes_and_goes(store: TaskStore) -> None:
    task_id = await _task(store, 3600, start_in_ms=3_600_000)
    scripts = await store.scripts()
    ledger = Ledger(keep=20, node=7, late_ms=1000)
    base = 1_700_000_000_000
    for chunk in range(20):  # 10,000 fires of one task, as consumers record them
        outcomes = [
            OutcomeWrite(task_id, 0, base + i * 1000 + 50, "", base + i * 1000, base + i * 1000 + 5)
            for i in range(chunk * 500, (chunk + 1) * 500)
        ]
        await scripts.record_outcomes(outcomes, "work", ledger)
    keys = await store.keys()
    raw = await store.client.execute("HGET", keys.history(keys.partition_of(task_id)), task_id)
    assert len(raw) == 6 + 20 * 12
    ring = decode_ring(raw)
    assert [o.due_ms for o in ring] == [base + i * 1000 for i in range(9999, 9979, -1)]
    assert ring[0].node == "#7" and ring[0].finished_ms == ring[0].started_ms + 45  # type: ignore[operator]

    late = base + 20_000_000

    def ok(due: int, lag: int, **more: Any) -> OutcomeWrite:
        return OutcomeWrite(task_id, 0, due + lag + 10, "", due, due + lag, **more)

    # Not judged (a retry, a manual fire), or within its spread and jitter: not late.
    for outcome in (
        ok(late, 4000, allowed_ms=None),
        ok(late, 4000, allowed_ms=3500),
        ok(late, 4000, attempt=1),
        ok(late, 4000, origin=2),
    ):
        await scripts.record_outcomes([outcome], "work", ledger)
        assert not await _on_list(store, task_id, "late")
    await scripts.record_outcomes([ok(late, 4000, allowed_ms=0)], "work", ledger)
    assert await _on_list(store, task_id, "late")
    assert await attention_counts(store) == {("work", "late"): 1}
    on_time = late + 1000
    await scripts.record_outcomes([ok(on_time, 10, allowed_ms=0)], "work", ledger)
    assert not await _on_list(store, task_id, "late")
    assert await attention_counts(store) == {("work", "late"): 0}
    # Late by a hair over a bound above 32.7 s (kept to the second in the ring): it still
    # leaves the list with the next fire on time.
    ledger = Ledger(keep=20, node=7, late_ms=60_000)
    await scripts.record_outcomes([ok(late + 2000, 60_500, allowed_ms=0)], "work", ledger)
    assert await _on_list(store, task_id, "late")
    await scripts.record_outcomes([ok(late + 3000, 5, allowed_ms=0)], "work", ledger)
    assert not await _on_list(store, task_id, "late")


async def test_a_decision_made_again_is_recorded_once_and_a_deleted_task_gets_none(
    store: TaskStore,
) -> None:
    task_id = await _task(store, 3600, start_in_ms=3_600_000)
    scripts = await store.scripts()
    planned = {(await store.keys()).partition_of(task_id): [
        Planned(task_id, "A", [], [1000, 2000], task_type="work")
    ]}  # fmt: skip
    for token in ("claim", "claim", "again"):  # a lost reply, then a claim after a refusal
        await scripts.decide_overlaps(token, planned)
    history = await task_history(store, task_id)
    assert [(o.fate, o.reason, o.due_ms) for o in history] == [
        ("skipped", "expired", 2000), ("skipped", "expired", 1000),
    ]  # fmt: skip
    assert await attention_counts(store) == {("work", "expired"): 1}
    await store.delete(task_id)
    await scripts.decide_overlaps("late", planned)
    assert (await attention_page(store))[0] == []
    keys = await store.keys()
    ring = await store.client.execute("HGET", keys.history(keys.partition_of(task_id)), task_id)
    assert ring is None


async def test_grid_times_an_operators_cancel_other_fire_displaces_are_occurrences(
    redis_client: RedisClient, namespace: str
) -> None:
    """A buffer_all task with a fire in flight and two grid times waiting; an operator's
    trigger under ``cancel_other`` displaces the two: each is in the history as skipped
    (and the task on the attention list), as when the poller's own decision displaces
    them."""
    store = TaskStore(redis_client, namespace, default_partitions=1)
    now = await store.now_ms()
    later = Schedule("interval", every_s=3600, start_ms=now + 3_600_000, overlap="buffer_all")
    await store.create(TaskSpec("work", later, task_id="b"))
    scripts = await store.scripts()
    running, waiting = now - 3000, [now - 2000, now - 1000]
    planned = {0: [Planned("b", "B", [running, *waiting], task_type="work")]}
    assert (await scripts.decide_overlaps("claim", planned))["b"].run == [(running, True)]
    await scripts.confirm_flights("claim", ["b"])
    await store.trigger("b", "cancel_other")
    history = await task_history(store, "b")
    assert [(o.fate, o.reason, o.origin, o.due_ms) for o in history] == [
        ("skipped", "overlap", "schedule", d) for d in reversed(waiting)
    ]
    assert await attention_counts(store) == {("work", "skipped"): 1}


@pytest.mark.parametrize("keep", [0, 40])
async def test_an_operators_decision_keeps_the_history_at_the_configured_length(
    redis_client: RedisClient, namespace: str, keep: int
) -> None:
    """``[scheduler] history`` holds for the grid times an operator's fire displaces: a
    ring of 30 is not cut to the default 20, and with none kept no ring is written."""
    store = TaskStore(redis_client, namespace, default_partitions=1, history=keep)
    now = await store.now_ms()
    later = Schedule("interval", every_s=3600, start_ms=now + 3_600_000, overlap="buffer_all")
    await store.create(TaskSpec("work", later, task_id="b"))
    scripts = await store.scripts()
    past = [now - 100_000 + i for i in range(30)]
    noted = {0: [Planned("b", "A", [], past, task_type="work")]}
    await scripts.decide_overlaps("expired", noted, history=keep)
    running, waiting = now - 3000, [now - 2000, now - 1000]
    planned = {0: [Planned("b", "B", [running, *waiting], task_type="work")]}
    await scripts.decide_overlaps("claim", planned, history=keep)
    await scripts.confirm_flights("claim", ["b"])
    await store.trigger("b", "cancel_other")
    history = await task_history(store, "b")
    assert len(history) == (32 if keep else 0)
    counts = await attention_counts(store)  # kept with no history too, as for the poller's
    assert counts.get(("work", "skipped"), 0) == 1, counts


async def test_an_operators_fire_a_grid_decision_displaces_is_no_scheduled_occurrence(
    redis_client: RedisClient, namespace: str
) -> None:
    """A cancel_other task's trigger waits behind its fire in flight; the next grid time's
    decision displaces it: said not run, but not written into the history as a scheduled
    occurrence (it is none of the grid's)."""
    store = TaskStore(redis_client, namespace, default_partitions=1)
    now = await store.now_ms()
    later = Schedule("interval", every_s=3600, start_ms=now + 3_600_000, overlap="cancel_other")
    await store.create(TaskSpec("work", later, task_id="c"))
    scripts = await store.scripts()
    planned = {0: [Planned("c", "C", [now - 3000], task_type="work")]}
    await scripts.decide_overlaps("claim", planned)
    await scripts.confirm_flights("claim", ["c"])
    sid, _ = await store.trigger("c", "cancel_other")
    triggered = int(sid.rpartition(":")[2])
    grid = {0: [Planned("c", "C", [now - 500], task_type="work")]}
    assert triggered in (await scripts.decide_overlaps("claim-2", grid))["c"].skipped
    assert triggered not in {o.due_ms for o in await task_history(store, "c")}


async def test_a_task_created_again_after_an_earlier_versions_delete_starts_with_no_past(
    store: TaskStore,
) -> None:
    """A delete by an earlier version left a task's history, attention entry and
    acknowledgement behind: the task created again under its id showed the old
    occurrences and sat on the attention list. A create clears them."""
    task_id = await _task(store, 3600, start_in_ms=3_600_000)
    scripts = await store.scripts()
    keys = await store.keys()
    partition, bucket = keys.partition_of(task_id), keys.bucket_of(task_id)
    due = 1_700_000_000_000
    dead = OutcomeWrite(task_id, 2, due + 50, "boom", due, due + 5, allowed_ms=0)
    await scripts.record_outcomes([dead], "work", Ledger())
    await store.client.execute("HSET", f"{keys.tag(partition)}:acks", task_id, "an old ack")
    assert await _on_list(store, task_id, "dead")
    for key in (keys.definitions(partition, bucket), keys.states(partition, bucket)):
        await store.client.execute("HDEL", key, task_id)  # what the earlier delete took
    await store.client.execute("ZREM", keys.schedule(partition), task_id)
    await store.create(TaskSpec("work", Schedule("interval", every_s=3600), task_id=task_id))
    assert await task_history(store, task_id) == []
    assert not await _on_list(store, task_id, "dead")
    assert await store.client.execute("HGET", f"{keys.tag(partition)}:acks", task_id) is None
    counts = await attention_counts(store)
    assert not any(counts.values()), counts
