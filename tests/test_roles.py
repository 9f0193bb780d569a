"""The retry dispatcher and the claimer built directly, one tick at a time, against a real
Redis (the poller's own tests are in test_poller.py; the consumer's parts in
test_completion.py and test_execution.py)."""

from __future__ import annotations

import json
from pathlib import Path

import attrs
import pytest
import trio
import trio_util

from actors.domain.model import TaskSpec
from actors.domain.schedules import Schedule
from actors.execution.claimer import Claimer, ClaimerSettings
from actors.execution.completion import Outcome
from actors.execution.consumer import Consumer, ConsumerSettings, ConsumerState
from actors.execution.flight import Flight
from actors.execution.handlers import resolve
from actors.execution.reading import Reader
from actors.execution.results_log import ResultsLog
from actors.scheduling.retry_dispatcher import RetryDispatcher, RetryDispatcherSettings
from actors.store.keys import GROUP
from actors.store.messages import Message
from actors.store.replies import RetryWrite
from actors.store.streams import Streams
from actors.store.tasks import TaskStore
from runtime.actor import ActorContext
from runtime.channels import Mailbox
from runtime.errors import RedisUnavailable
from runtime.logging import get_logger
from runtime.redis_io import RedisClient
from tests.execution_harness import records, wait_records
from tests.waiting import eventually


@pytest.fixture
async def store(redis_client: RedisClient, namespace: str) -> TaskStore:
    return TaskStore(redis_client, namespace, default_partitions=2)


def message(task_id: str, attempt: int = 0) -> Message:
    return Message("1-0", task_id, f"{task_id}:7", "t", '{"n":1}', attempt, 7, 7, payload=None)


async def stream(store: TaskStore) -> list[dict[str, str]]:
    keys = await store.keys()
    entries = await store.client.execute("XRANGE", keys.queue("t"), "-", "+")
    return [Message.decode(i, fields, "t").fields() for i, fields in entries]  # either form


async def append(store: TaskStore, fields: dict[str, str]) -> bytes:
    """One message of type ``t`` in its stream, as a poller writes it; its entry id."""
    queue = (await store.keys()).queue("t")
    added: bytes = await store.client.execute(
        "XADD", queue, "*", *[v for kv in fields.items() for v in kv]
    )
    return added


async def with_tasks(store: TaskStore, *task_ids: str) -> None:
    """The tasks the retries are of (a retry of a task that does not exist is dropped)."""
    for task_id in task_ids:
        await store.create(TaskSpec("t", Schedule("interval", every_s=3600), task_id=task_id))


async def test_the_retry_dispatcher_moves_due_retries_back_to_the_stream(store: TaskStore) -> None:
    scripts = await store.scripts()
    await with_tasks(store, "due", "later")
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


async def test_the_retry_dispatcher_drops_the_markers_of_its_committed_claims(
    store: TaskStore,
) -> None:
    """A dispatcher's claim committed in full loses its enqueue markers at the
    dispatcher's next enqueue into the type: the stream keeps one claim's."""
    scripts = await store.scripts()
    keys = await store.keys()
    dispatcher = RetryDispatcher(store, RetryDispatcherSettings(of=1))
    await with_tasks(store, "a", "b", "c")
    for name in ("a", "b", "c"):
        await scripts.schedule_retries([RetryWrite(message(name), 0, "boom")])
        assert (await dispatcher.tick(scripts, [0, 1])).enqueued == 1
    assert len(await stream(store)) == 3
    assert len(await store.client.execute("KEYS", keys.enqueued_prefix("t") + "*")) == 1


async def test_the_claimer_takes_over_a_dead_consumers_message_for_its_own(
    store: TaskStore,
) -> None:
    keys = await store.keys()
    scripts = await store.scripts()
    queue = keys.queue("t")
    await (await store.streams()).ensure_group("t")
    await append(store, message("x").fields())
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
    # No free slot and nothing in the mailbox: one more is taken over all the same (a
    # consumer kept busy by a backlog must still take a dead one's messages), not two.
    for dead in ("y", "z"):
        await append(store, message(dead).fields())
    await store.client.execute("XREADGROUP", "GROUP", GROUP, "dead", "STREAMS", queue, ">")
    await trio.sleep(0.2)  # two leases: a busy consumer takes only what free ones left
    state.held.clear()  # the consumer started "x"
    state.free.value = 0
    assert await claimer.tick(scripts) == 1
    assert await claimer.tick(scripts) == 0  # one waits in the mailbox: nothing more


async def test_a_busy_claimer_leaves_a_message_idle_less_than_two_leases_to_free_ones(
    store: TaskStore,
) -> None:
    """A consumer with no free slot takes a dead consumer's message only once it has been
    idle two leases: between one and two, a consumer with free slots takes it first."""
    scripts = await store.scripts()
    queue = (await store.keys()).queue("t")
    await (await store.streams()).ensure_group("t")
    await append(store, message("x").fields())
    await store.client.execute("XREADGROUP", "GROUP", GROUP, "dead", "STREAMS", queue, ">")
    busy, free = ConsumerState(name="busy"), ConsumerState(name="free")
    free.free.value = 1
    settings = ClaimerSettings(lease_s=2)
    claimers = [
        Claimer(store, "t", state, Mailbox[Message].open(5), "n1", settings)
        for state in (busy, free)
    ]
    await trio.sleep(2.5)  # idle one lease and a half
    assert await claimers[0].tick(scripts) == 0
    assert await claimers[1].tick(scripts) == 1


async def test_a_dead_consumers_message_runs_before_a_backlog_drains(
    redis_client: RedisClient, namespace: str, tmp_path: Path, record: Path
) -> None:
    """A consumer with one slot, kept busy by a backlog of thirty fires (0.1 s each), and
    a fire pending under a dead consumer: its claimer takes it over though no slot is ever
    free when it looks (once it is idle two leases), and it starts at the next free slot,
    before the reader's next read; it does not wait for the backlog to drain."""
    store = TaskStore(redis_client, namespace, default_partitions=2)
    keys = await store.keys()
    queue = keys.queue("t")
    await (await store.streams()).ensure_group("t")

    async def add(task_id: str) -> None:
        await append(store, {**message(task_id).fields(), "payload": '{"sleep_s": 0.1}'})

    await add("orphan")
    await store.client.execute("XREADGROUP", "GROUP", GROUP, "dead", "STREAMS", queue, ">")
    for i in range(30):
        await add(f"b{i:02d}")
    state, inbox = ConsumerState(), Mailbox[Message].open(1)
    settings = ConsumerSettings(concurrency=1, lease_s=0.5)
    consumer = Consumer(
        store, "t", settings, resolve("t", "tests.handlers.jobs:sleepy"),
        ResultsLog(tmp_path / "results.jsonl"), "n1", inbox, state,
    )  # fmt: skip
    claimer = Claimer(store, "t", state, inbox, "n1", ClaimerSettings(interval_s=0.05, lease_s=0.5))
    ctx = ActorContext("node/consumers/t/consumer", 5.0, get_logger(actor="consumer"))
    claimer_ctx = ActorContext("node/consumers/t/claimer", 5.0, get_logger(actor="claimer"))
    async with trio.open_nursery() as nursery:
        await nursery.start(consumer.run, ctx)
        await nursery.start(claimer.run, claimer_ctx)
        found = await wait_records(
            record, lambda rs: [r for r in rs if r["event"] == "ran" and r["task_id"] == "orphan"],
            timeout_s=60,
        )  # fmt: skip
        ctx.stop_requested.value = True
        nursery.cancel_scope.cancel()
    assert found
    started = [r["task_id"] for r in records(record) if r["event"] == "started"]
    assert "orphan" in started[:25], started


class LosesOneReadReply(Streams):
    """The real stream commands, except that the first read that delivers messages raises
    as if Redis went away before its reply arrived: the messages are pending under the
    consumer's name, and it never saw them."""

    lost = 1

    async def read_group(
        self, task_type: str, consumer: str, count: int, block_ms: int
    ) -> tuple[list[Message], list[tuple[str, dict[bytes, bytes], str]]]:
        result = await super().read_group(task_type, consumer, count, block_ms)
        if self.lost and result[0]:
            self.lost -= 1
            raise RedisUnavailable("injected: the reply of a read that delivered was lost")
        return result


class LossyStore(TaskStore):
    async def streams(self) -> Streams:
        if self._streams is None:
            self._streams = LosesOneReadReply(self.client, await self.keys())
        return self._streams


async def test_messages_of_a_read_whose_reply_was_lost_run_at_once(
    redis_client: RedisClient, namespace: str, tmp_path: Path, record: Path
) -> None:
    store = LossyStore(redis_client, namespace, default_partitions=2)
    await (await store.streams()).ensure_group("t")
    for i in range(3):
        await append(store, message(f"m{i}").fields())
    settings = ConsumerSettings(concurrency=5, lease_s=60)  # a lease-based reclaim: far off
    consumer = Consumer(
        store, "t", settings, resolve("t", "tests.handlers.jobs:noop"),
        ResultsLog(tmp_path / "results.jsonl"), "n1", Mailbox.open(5), ConsumerState(),
    )  # fmt: skip
    ctx = ActorContext("node/consumers/t/consumer", 5.0, get_logger(actor="consumer"))
    async with trio.open_nursery() as nursery:
        await nursery.start(consumer.run, ctx)
        found = await wait_records(record, lambda rs: len(rs) == 3, timeout_s=30)
        ctx.stop_requested.value = True
    assert sorted(r["task_id"] for r in found) == ["m0", "m1", "m2"]
    streams = await store.streams()
    assert isinstance(streams, LosesOneReadReply)
    assert streams.lost == 0  # the reply was lost, and the messages still ran


async def test_a_duplicate_dropped_at_begin_is_no_longer_in_flight(store: TaskStore) -> None:
    """A second message of a fire already started is acknowledged and dropped: it must
    leave the consumer's in-flight map too, or its lease is renewed (and it is released)
    for ever."""
    scripts, streams = await store.scripts(), await store.streams()
    await streams.ensure_group("t")
    ids = []
    for _ in range(2):  # two messages of one fire (a producer died between XADD and commit)
        ids.append((await append(store, message("dup").fields())).decode())
    first, second = (attrs.evolve(message("dup"), msg_id=i) for i in ids)
    started: list[Message] = []

    def start(ms: list[Message]) -> None:
        started.extend(ms)

    flight = Flight()
    free = trio_util.AsyncValue(5)
    reader = Reader(
        scripts, streams, "t", "n1", flight, ConsumerState(free=free), start,
        block_ms=100, dedupe_window_ms=60_000, actor="test",
    )  # fmt: skip
    for m in (first, second):
        flight.messages[m.msg_id] = m
        await reader.begin([m])
    assert started == [first]
    assert list(flight.messages) == [first.msg_id]  # the duplicate is gone from flight


async def test_a_flush_cut_off_while_it_waits_leaves_its_batch_to_the_last_flush(
    store: TaskStore, tmp_path: Path
) -> None:
    """A consumer stopping cancels its flush loop wherever it is, waiting for the pending
    lock say. The batch it had taken goes on in the consumer's last flush: acknowledged
    here, each results line written once, not released to run again elsewhere."""
    streams, scripts = await store.streams(), await store.scripts()
    await streams.ensure_group("t")
    keys = await store.keys()
    for i in range(3):
        await append(store, message(f"m{i}").fields())
    read, _ = await streams.read_group("t", "n1", 10, 100)
    results = ResultsLog(tmp_path / "results.jsonl")
    consumer = Consumer(
        store, "t", ConsumerSettings(), resolve("t", "tests.handlers.jobs:noop"), results,
        "n1", Mailbox.open(5), ConsumerState(),
    )  # fmt: skip
    flight = Flight()
    for m in read:
        flight.messages[m.msg_id] = m
        flight.finish(Outcome(m, 10, 20, result={"n": 1}))
    lock = consumer.state.pending_lock
    await lock.acquire()  # a recovery holds it
    async with trio.open_nursery() as nursery:
        nursery.start_soon(consumer._flush, scripts, flight)
        await trio.sleep(0.2)  # the flush waits for the lock...
        nursery.cancel_scope.cancel()  # ...when the consumer stops
    lock.release()
    await consumer._flush(scripts, flight)  # the last flush
    summary = await store.client.execute("XPENDING", keys.queue("t"), GROUP)
    assert summary["pending"] == 0
    assert flight.messages == {} and flight.unsettled is None
    lines = (tmp_path / "results.jsonl").read_text().splitlines()
    assert sorted(json.loads(line)["task_id"] for line in lines) == ["m0", "m1", "m2"]


async def test_the_reader_leaves_a_free_slot_to_a_message_waiting_in_the_mailbox(
    store: TaskStore,
) -> None:
    """A message the claimer took over waits in the mailbox (``held``): a slot that frees
    is the mailbox's, and the reader reads only for the slots beyond it."""
    scripts, streams = await store.scripts(), await store.streams()
    await streams.ensure_group("t")
    for i in range(3):
        await append(store, message(f"m{i}").fields())
    started: list[Message] = []
    free = trio_util.AsyncValue(1)

    def start(ms: list[Message]) -> None:  # as the handler pool takes them: a slot each
        started.extend(ms)
        free.value -= len(ms)

    state = ConsumerState(free=free, held={"9-0": message("taken-over")})
    reader = Reader(
        scripts, streams, "t", "n1", Flight(), state, start,
        block_ms=50, dedupe_window_ms=0, actor="test",
    )  # fmt: skip
    stopping = trio_util.AsyncBool(False)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(reader.read_stream, "n1", stopping)
        await trio.sleep(0.3)
        assert started == []  # the one slot is the mailbox's
        free.value = 3  # two more free up

        async def two_started() -> bool:
            return len(started) >= 2

        await eventually(two_started, 30, poll_s=0.01)
        await trio.sleep(0.3)  # and no more
        assert len(started) == 2
        # The mailbox's message is dropped unstarted (expired, a duplicate): no slot
        # frees, and the reader must still read for the one it no longer waits for.
        state.held.clear()

        async def three_started() -> bool:
            return len(started) >= 3

        await eventually(three_started, 30, poll_s=0.01)
        stopping.value = True
    assert [m.task_id for m in started] == ["m0", "m1", "m2"]
