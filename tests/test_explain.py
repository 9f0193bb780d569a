"""``explain`` in process, against a real Redis with no poller running: each state of a task
comes out as the right first sentence, from what is really in Redis."""

from __future__ import annotations

import pytest

from actors.api.explain import explain
from actors.domain.errors import TaskNotFound
from actors.domain.model import TaskSpec
from actors.domain.schedules import Schedule
from actors.store.keys import GROUP
from actors.store.tasks import TaskStore
from runtime.redis_io import RedisClient
from tests.execution_harness import one_message_queued


@pytest.fixture
async def store(redis_client: RedisClient, namespace: str) -> TaskStore:
    return TaskStore(redis_client, namespace)


async def test_a_task_past_due_with_no_poller_is_overdue(store: TaskStore) -> None:
    now = await store.now_ms()
    await store.create(TaskSpec("t", Schedule("once", at_ms=now - 60_000), task_id="late"))
    facts = await explain(store, "late")
    assert facts["in_schedule_index"] and facts["index_score_ms"] == now - 60_000
    assert facts["summary"][0].startswith("overdue by 6")
    assert "no poller serves partition" in facts["summary"][0]
    assert facts["partition_owner"] == {"poller": None, "lease_until_ms": None, "live": False}
    assert facts["summary"][-1] == "has not run yet"


async def test_jitter_moves_the_real_due_time_and_is_not_overdue(store: TaskStore) -> None:
    now = await store.now_ms()
    schedule = Schedule("interval", every_s=3600, start_ms=now + 600_000, jitter_s=30)
    await store.create(TaskSpec("t", schedule, task_id="jittery"))
    facts = await explain(store, "jittery")
    assert facts["next_run_ms"] == now + 600_000
    assert now + 600_000 <= facts["index_score_ms"] <= now + 630_000
    first = facts["summary"][0]
    assert first.startswith("active: next fire at") and "every 3600s" in first
    assert "jitter up to 30s" in facts["schedule_text"]


async def test_paused_finished_and_unindexed_tasks(store: TaskStore) -> None:
    now = await store.now_ms()
    later = Schedule("interval", every_s=60, start_ms=now + 600_000)
    await store.create(TaskSpec("t", later, task_id="p"))
    await store.pause("p")
    assert (await explain(store, "p"))["summary"][0].startswith("paused")

    await store.create(TaskSpec("t", Schedule("once", at_ms=now - 1, end_ms=now - 2),
                                task_id="done"))  # fmt: skip
    assert (await explain(store, "done"))["summary"][0].startswith("finished")

    await store.create(TaskSpec("t", later, task_id="lost"))
    keys = await store.keys()
    await store.client.execute("ZREM", keys.schedule(keys.partition_of("lost")), "lost")
    facts = await explain(store, "lost")
    assert facts["in_schedule_index"] is False
    assert facts["summary"][0].startswith("active but missing from the schedule index")

    with pytest.raises(TaskNotFound):
        await explain(store, "nobody")


async def test_a_task_a_poller_holds_is_explained_as_claimed(store: TaskStore) -> None:
    now = await store.now_ms()
    await store.create(TaskSpec("t", Schedule("once", at_ms=now - 10), task_id="held"))
    assert (await explain(store, "held"))["claimed_by_poller"] is False
    keys = await store.keys()
    await (await store.scripts()).claim_due(
        [keys.partition_of("held")], "poller-a", "poller-a-1", 10, 60_000
    )
    facts = await explain(store, "held")
    assert facts["claimed_by_poller"] is True
    assert facts["partition_owner"]["poller"] == "poller-a" and facts["partition_owner"]["live"]
    assert "claimed by a poller right now: its due fire is being enqueued" in facts["summary"]


async def test_a_compact_message_is_shown_with_its_schedule_id(store: TaskStore) -> None:
    """Compact messages leave ``schedule_id`` out (actors.store.messages): explain derives it."""
    await store.create(TaskSpec("t", Schedule("once", at_ms=4102444800000), task_id="m"))
    stream, _ = await one_message_queued(store, "t", "m")  # the full form: "m:1"
    await store.client.execute(
        "XADD", stream, "*", "task_id", "m", "payload", "1", "attempt", "2", "due_ms", "5"
    )
    shown = [(m["schedule_id"], m["attempt"]) for m in (await explain(store, "m"))["stream"]]
    assert sorted(shown) == [("m:1", 0), ("m:5", 2)]


async def test_an_acknowledged_message_is_not_shown_while_it_waits_to_be_trimmed(
    store: TaskStore,
) -> None:
    """Consumers acknowledge without deleting; explain shows the message queued, then
    running, and not at all once acknowledged (though still in the stream)."""
    await store.create(TaskSpec("t", Schedule("once", at_ms=4102444800000), task_id="m"))
    stream, msg_id = await one_message_queued(store, "t", "m")
    assert [m["delivered"] for m in (await explain(store, "m"))["stream"]] == [False]
    await store.client.execute("XREADGROUP", "GROUP", GROUP, "c", "STREAMS", stream, ">")
    assert [m["delivered"] for m in (await explain(store, "m"))["stream"]] == [True]
    await (await store.scripts()).ack("t", [msg_id])
    assert await store.client.execute("XLEN", stream) == 1
    assert (await explain(store, "m"))["stream"] == []
