"""The retry dispatcher and the claimer built directly, one tick at a time, against a real
Redis (the poller's own tests are in test_poller.py; the consumer's parts in
test_completion.py and test_execution.py)."""

from __future__ import annotations

import pytest
import trio

from actors.execution.claimer import Claimer, ClaimerSettings
from actors.execution.consumer import ConsumerState
from actors.scheduling.retry_dispatcher import RetryDispatcher, RetryDispatcherSettings
from actors.store.keys import GROUP
from actors.store.messages import Message
from actors.store.replies import RetryWrite
from actors.store.tasks import TaskStore
from runtime.channels import Mailbox
from runtime.redis_io import RedisClient


@pytest.fixture
async def store(redis_client: RedisClient, namespace: str) -> TaskStore:
    return TaskStore(redis_client, namespace, default_partitions=2)


def message(task_id: str, attempt: int = 0) -> Message:
    return Message("1-0", task_id, f"{task_id}:7", "t", '{"n":1}', attempt, 7, 7, payload=None)


async def stream(store: TaskStore) -> list[dict[str, str]]:
    keys = await store.keys()
    entries = await store.client.execute("XRANGE", keys.queue("t"), "-", "+")
    return [{k.decode(): v.decode() for k, v in fields.items()} for _id, fields in entries]


async def test_the_retry_dispatcher_moves_due_retries_back_to_the_stream(store: TaskStore) -> None:
    scripts = await store.scripts()
    await scripts.schedule_retries(
        [RetryWrite(message("due"), 0, "boom"), RetryWrite(message("later"), 600_000, "bang")]
    )
    dispatcher = RetryDispatcher(store, RetryDispatcherSettings(of=1))
    result = await dispatcher.tick(scripts, [0, 1])
    (fire,) = await stream(store)
    # The same fire (schedule_id), its next attempt, its payload: recognisably a retry.
    assert (fire["task_id"], fire["schedule_id"], fire["attempt"], fire["payload"]) == (
        "due", "due:7", "1", '{"n":1}',
    )  # fmt: skip
    assert result.enqueued == 1 and result.earliest_ms is not None  # "later" still waits
    assert (await dispatcher.tick(scripts, [0, 1])).enqueued == 0  # committed: once only


async def test_the_claimer_takes_over_a_dead_consumers_message_for_its_own(
    store: TaskStore,
) -> None:
    keys = await store.keys()
    scripts = await store.scripts()
    queue = keys.queue("t")
    await (await store.streams()).ensure_group("t")
    fields = message("x").fields()
    await store.client.execute("XADD", queue, "*", *[v for kv in fields.items() for v in kv])
    await store.client.execute("XREADGROUP", "GROUP", GROUP, "dead", "STREAMS", queue, ">")
    state = ConsumerState(name="alive")
    state.free.value = 5
    inbox: Mailbox[Message] = Mailbox.open(5)
    claimer = Claimer(store, "t", state, inbox, "n1", ClaimerSettings(lease_s=0.05))
    await trio.sleep(0.1)  # the dead consumer's lease runs out
    assert await claimer.tick(scripts) == 1
    handed = inbox.receive.receive_nowait()
    assert (handed.task_id, handed.schedule_id) == ("x", "x:7")
    summary = await store.client.execute("XPENDING", queue, GROUP)
    assert [c["name"] for c in summary["consumers"]] == [b"alive"]  # the live consumer's now
    state.free.value = 0
    assert await claimer.tick(scripts) == 0  # no free slot: claims nothing
