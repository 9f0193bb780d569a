"""Consumers' batches of outcomes written together (``actors.execution.completion_group``,
``actors.store.completion_writes``), against a real Redis: the batches share each
partition's calls, yet each keeps its own fate (its ACKs, its refusals, its repeats)."""

from __future__ import annotations

from typing import Any

import pytest
import trio
from redis.exceptions import ResponseError

from actors.domain.model import TaskSpec
from actors.domain.schedules import Schedule
from actors.execution.completion_group import CompletionGroup
from actors.store.completion_writes import OUTCOMES, RETRIES, CompletionWrite, shared_parts
from actors.store.history import DEFAULT_HISTORY, Ledger, decode_ring
from actors.store.keys import GROUP, Keys
from actors.store.ledger import attention_counts
from actors.store.messages import Message
from actors.store.replies import OutcomeWrite, RetryWrite
from actors.store.tasks import TaskStore
from runtime.errors import RedisUnavailable
from runtime.redis_io import RedisClient


@pytest.fixture
def store(redis_client: RedisClient, namespace: str) -> TaskStore:
    return TaskStore(redis_client, namespace, default_partitions=4)


async def _tasks(store: TaskStore, by_type: dict[str, int]) -> dict[str, list[str]]:
    """Tasks of each type, all in partition 0 (so their outcomes share its calls)."""
    keys = await store.keys()
    ids = iter([t for t in (f"g{i}" for i in range(1000)) if keys.partition_of(t) == 0])
    schedule = Schedule("interval", every_s=3600, start_ms=await store.now_ms() + 3_600_000)
    out = {task_type: [next(ids) for _ in range(count)] for task_type, count in by_type.items()}
    specs = [TaskSpec(t, schedule, task_id=i) for t, of_type in out.items() for i in of_type]
    await store.create_many(specs)
    return out


async def _pending(client: RedisClient, keys: Keys, task_type: str, count: int) -> list[str]:
    """``count`` messages of ``task_type``'s stream, read (pending) by consumer ``c``."""
    stream = keys.queue(task_type)
    await client.execute("XGROUP", "CREATE", stream, GROUP, "0", "MKSTREAM")
    ids = [
        (await client.execute("XADD", stream, "*", "task_id", f"m{i}")).decode()
        for i in range(count)
    ]
    await client.execute("XREADGROUP", "GROUP", GROUP, "c", "STREAMS", stream, ">")
    return ids


async def _pending_count(client: RedisClient, keys: Keys, task_type: str) -> int:
    summary = await client.execute_unparsed("XPENDING", keys.queue(task_type), GROUP)
    return int(summary[0])


async def _ring(store: TaskStore, task_id: str) -> list[Any]:
    keys = await store.keys()
    raw = await store.client.execute("HGET", keys.history(keys.partition_of(task_id)), task_id)
    return [] if raw is None else decode_ring(raw)


def _ok(task_id: str, due: int, lag: int) -> OutcomeWrite:
    return OutcomeWrite(task_id, 0, due + lag + 10, "", due, due + lag, allowed_ms=0)


def _message(task_id: str, task_type: str) -> Message:
    return Message("1-1", task_id, f"{task_id}:1", task_type, "null", 0, 1, 1, None)


def test_batches_of_many_types_share_one_call_a_partition() -> None:
    keys = Keys("ns", 4)
    a, b = [t for t in (f"t{i}" for i in range(100)) if keys.partition_of(t) == 0][:2]
    ledger = Ledger(keep=20, node=3)
    first = CompletionWrite("one", outcomes=[_ok(a, 1, 1)], ledger=ledger)
    second = CompletionWrite("two", outcomes=[_ok(b, 1, 1)], ledger=ledger)
    (shared,) = shared_parts([first, second], keys.partition_of)
    assert shared.part == (OUTCOMES, 0, 20, 3)
    assert [(w.task_type, [o.task_id for o in items]) for w, items in shared.shares] == [
        ("one", [a]),
        ("two", [b]),
    ]
    # A batch whose history settings differ has its own call: each call has one of them.
    third = CompletionWrite("three", outcomes=[_ok(a, 2, 1)], ledger=Ledger(keep=5, node=3))
    assert len(shared_parts([first, third], keys.partition_of)) == 2
    # Retry contexts are never shared: a call failing partway would write the others again.
    retries = [
        CompletionWrite(t, retries=[RetryWrite(_message(i, t), 10, "boom")])
        for t, i in (("one", a), ("two", b))
    ]
    assert [len(s.shares) for s in shared_parts(retries, keys.partition_of)] == [1, 1]


async def test_batches_written_together_keep_their_types_and_are_each_acknowledged(
    store: TaskStore,
) -> None:
    """Two types' outcomes in one call of their partition: each task's history gets its
    fire, and a late start puts its task on the attention list under its own type, with
    its own type's lateness bound; each batch's messages are acknowledged."""
    scripts, keys, client = await store.scripts(), await store.keys(), store.client
    tasks = await _tasks(store, {"fast": 1, "slow": 1})
    (fast,), (slow,) = tasks["fast"], tasks["slow"]
    fast_ids, slow_ids = (
        await _pending(client, keys, "fast", 2),
        await _pending(client, keys, "slow", 1),
    )
    due = 1_700_000_000_000
    # Both start 5 s late: beyond fast's 1 s bound, within slow's 60 s one.
    writes = [
        CompletionWrite("fast", outcomes=[_ok(fast, due, 5000)], acks=fast_ids,
                        ledger=Ledger(keep=20, node=1, late_ms=1000)),
        CompletionWrite("slow", outcomes=[_ok(slow, due, 5000)], acks=slow_ids,
                        ledger=Ledger(keep=20, node=1, late_ms=60_000)),
    ]  # fmt: skip
    assert await scripts.complete(writes) == [None, None]
    assert [o.due_ms for o in await _ring(store, fast)] == [due]
    assert [o.due_ms for o in await _ring(store, slow)] == [due]
    assert await attention_counts(store) == {("fast", "late"): 1}
    assert await _pending_count(client, keys, "fast") == 0
    assert await _pending_count(client, keys, "slow") == 0


async def test_a_refused_write_fails_only_its_batches_and_a_repeat_sends_only_the_rest(
    store: TaskStore,
) -> None:
    """One batch's retry context is refused (its key holds a string): that batch is not
    acknowledged, the batch written beside it is; the partition call they shared went
    through for both. Repeated once the key is fixed, the refused batch sends its retry
    alone: its outcome is not written twice."""
    scripts, keys, client = await store.scripts(), await store.keys(), store.client
    tasks = await _tasks(store, {"broken": 1, "fine": 1})
    (broken,), (fine,) = tasks["broken"], tasks["fine"]
    broken_ids, fine_ids = (
        await _pending(client, keys, "broken", 1),
        await _pending(client, keys, "fine", 1),
    )
    await client.execute("SET", keys.retry(0), "not a sorted set")
    due = 1_700_000_000_000
    message = Message(broken_ids[0], broken, f"{broken}:{due}", "broken", "null", 0, due, due, None)
    ledger = Ledger(keep=20, node=1)
    refused = CompletionWrite(
        "broken", retries=[RetryWrite(message, 1000, "boom")], outcomes=[_ok(broken, due, 5)],
        acks=broken_ids, ledger=ledger,
    )  # fmt: skip
    fine_write = CompletionWrite("fine", outcomes=[_ok(fine, due, 5)], acks=fine_ids, ledger=ledger)
    error, ok = await scripts.complete([refused, fine_write])
    assert error is not None and "WRONGTYPE" in str(error) and ok is None
    assert refused.written == {(OUTCOMES, 0, 20, 1)}  # its outcome went, its retry did not
    assert await _pending_count(client, keys, "broken") == 1
    assert await _pending_count(client, keys, "fine") == 0
    await client.execute("DEL", keys.retry(0))
    assert await scripts.complete([refused]) == [None]
    assert refused.written == {(OUTCOMES, 0, 20, 1), (RETRIES, 0, 0, 0)}
    assert [o.due_ms for o in await _ring(store, broken)] == [due]  # written once
    assert await client.execute("ZCARD", keys.retry(0)) == 1
    assert await _pending_count(client, keys, "broken") == 0


async def test_batches_arriving_while_a_write_is_out_go_together(store: TaskStore) -> None:
    scripts, keys, client = await store.scripts(), await store.keys(), store.client
    tasks = await _tasks(store, {f"t{i}": 1 for i in range(4)})
    group = CompletionGroup()
    writes = []
    for task_type, (task_id,) in tasks.items():
        ids = await _pending(client, keys, task_type, 1)
        writes.append(
            CompletionWrite(task_type, outcomes=[_ok(task_id, 1, 1)], acks=ids, ledger=Ledger())
        )
    async with trio.open_nursery() as nursery:
        for write in writes:
            nursery.start_soon(group.complete, scripts, write)
    assert group.batches == 4 and group.writes < 4
    for task_type in tasks:
        assert await _pending_count(client, keys, task_type) == 0


async def test_a_write_cut_off_fails_the_batches_waiting_on_it_as_an_outage(
    store: TaskStore, redis_client: RedisClient
) -> None:
    """The batch whose task writes for the group is cancelled mid-write (Redis paused):
    the batches that went with it are told to repeat (an outage), not left waiting."""
    scripts, client = await store.scripts(), store.client
    tasks = await _tasks(store, {"a": 1, "b": 1})
    group = CompletionGroup()
    writes = [
        CompletionWrite(t, outcomes=[_ok(task_id, 1, 1)], ledger=Ledger())
        for t, (task_id,) in tasks.items()
    ]
    followed: list[BaseException] = []

    async def follow(write: CompletionWrite) -> None:
        try:
            await group.complete(scripts, write)
        except RedisUnavailable as exc:
            followed.append(exc)

    await redis_client.execute("CLIENT", "PAUSE", 10_000, "WRITE")
    try:
        with trio.fail_after(8):
            async with trio.open_nursery() as nursery:
                with trio.move_on_after(0.3) as leader:
                    nursery.start_soon(follow, writes[1])
                    await group.complete(scripts, writes[0])
    finally:
        await redis_client.execute("CLIENT", "UNPAUSE")
    assert leader.cancelled_caught
    assert len(followed) == 1  # told, whatever ended the write: it repeats its batch
    await client.wait_abandoned()


async def test_one_batchs_failing_row_leaves_the_others_in_its_call_written_once(
    store: TaskStore,
) -> None:
    """Two batches' outcomes in one call of their partition; the second's failure row
    meets a key of the wrong type. The first batch's rows went through, once: it is
    acknowledged and never sent again; the second repeats alone once the key is fixed."""
    scripts, keys, client = await store.scripts(), await store.keys(), store.client
    tasks = await _tasks(store, {"good": 1, "bad": 1})
    (good,), (bad,) = tasks["good"], tasks["bad"]
    good_ids, bad_ids = (
        await _pending(client, keys, "good", 1),
        await _pending(client, keys, "bad", 1),
    )
    await client.execute("SET", f"{keys.tag(0)}:errors", "not a hash")
    due, ledger = 1_700_000_000_000, Ledger(keep=20, node=1)
    failed = OutcomeWrite(bad, 1, due + 20, "boom", due, due + 5)
    writes = [
        CompletionWrite("good", outcomes=[_ok(good, due, 5)], acks=good_ids, ledger=ledger),
        CompletionWrite("bad", outcomes=[failed], acks=bad_ids, ledger=ledger),
    ]
    ok, error = await scripts.complete(writes)
    assert ok is None and error is not None and "WRONGTYPE" in str(error)
    assert writes[0].written == {(OUTCOMES, 0, 20, 1)} and not writes[1].written
    assert await _pending_count(client, keys, "good") == 0
    assert await _pending_count(client, keys, "bad") == 1
    await client.execute("DEL", f"{keys.tag(0)}:errors")
    assert await scripts.complete([writes[1]]) == [None]
    assert [o.due_ms for o in await _ring(store, good)] == [due]
    assert [o.due_ms for o in await _ring(store, bad)] == [due]
    assert await _pending_count(client, keys, "bad") == 0


async def test_a_batch_whose_ack_is_refused_holds_back_no_other(store: TaskStore) -> None:
    scripts, keys, client = await store.scripts(), await store.keys(), store.client
    tasks = await _tasks(store, {"good": 1, "broken": 1})
    good_ids = await _pending(client, keys, "good", 1)
    await client.execute("SET", keys.queue("broken"), "not a stream")
    writes = [
        CompletionWrite("good", outcomes=[_ok(tasks["good"][0], 1, 1)], acks=good_ids),
        CompletionWrite("broken", outcomes=[_ok(tasks["broken"][0], 1, 1)], acks=["1-1"]),
    ]
    ok, error = await scripts.complete(writes)
    assert ok is None and error is not None and "WRONGTYPE" in str(error)
    assert await _pending_count(client, keys, "good") == 0
    assert writes[1].written == {(OUTCOMES, 0, DEFAULT_HISTORY, 0)}  # not sent again


async def test_a_batch_that_cannot_be_encoded_fails_alone(store: TaskStore) -> None:
    """A value that does not encode in one batch of a write: that batch's consumer gets the
    error, once it goes alone; the batch written beside it is written and acknowledged."""
    scripts, keys, client = await store.scripts(), await store.keys(), store.client
    tasks = await _tasks(store, {"good": 1, "odd": 1})
    good_ids, odd_ids = (
        await _pending(client, keys, "good", 1),
        await _pending(client, keys, "odd", 1),
    )
    odd = OutcomeWrite(tasks["odd"][0], 2, 5, object(), 1, 2)  # type: ignore[arg-type]
    writes = [
        CompletionWrite("good", outcomes=[_ok(tasks["good"][0], 1, 1)], acks=good_ids),
        CompletionWrite("odd", outcomes=[odd], acks=odd_ids),
    ]
    group = CompletionGroup()
    raised: dict[str, BaseException] = {}

    async def complete(write: CompletionWrite) -> None:
        try:
            await client.ride_out(lambda: group.complete(scripts, write))
        except Exception as exc:
            raised[write.task_type] = exc

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            for write in writes:
                nursery.start_soon(complete, write)
    assert list(raised) == ["odd"] and isinstance(raised["odd"], TypeError)
    assert group.batches == 4 and group.writes == 3  # together, then each alone
    assert await _pending_count(client, keys, "good") == 0
    assert await _pending_count(client, keys, "odd") == 1


@pytest.mark.parametrize(
    ("key", "second"),
    [
        ("errors", 1),
        ("history", 1),
        ("history:errors", 1),
        ("attention", 2),
        ("attention:counts", 2),
    ],
)
async def test_a_partition_key_of_another_kind_fails_the_group_before_any_write(
    store: TaskStore, key: str, second: int
) -> None:
    """A key of the partition that rows write beside their task's own records (the last
    errors, the history and its error lines, the attention list and its counts) holds a
    string: the group whose second row (a retry, or a dead fire) would write there fails
    before its first row (an ok fire) is written, however often it is tried (that row
    was written at every try, its run count and history growing). Mended, each row is
    written once."""
    tasks = await _tasks(store, {"t": 2})
    good, bad = tasks["t"]
    keys = await store.keys()
    await store.client.execute("SET", f"{keys.tag(0)}:{key}", "not a hash")
    scripts = await store.scripts()
    due = 1_700_000_000_000
    rows = [
        _ok(good, due, 5),
        OutcomeWrite(bad, second, due + 20, "boom", due, due + 5, line="boom"),
    ]
    for _ in range(3):
        with pytest.raises(
            ResponseError, match=f"^WRONGTYPE .* \\({keys.tag(0)}:{key}\\): the outcome of task"
        ):
            await scripts.record_outcomes(rows, "t")
    assert await store.client.execute("HGET", keys.runs(0, keys.bucket_of(good)), good) is None
    if key != "history":
        assert await store.client.execute("HGET", keys.history(0), good) is None
    await store.client.execute("DEL", f"{keys.tag(0)}:{key}")
    assert await scripts.record_outcomes(rows, "t") == 2
    found = await store.get(good)
    assert found is not None and found.runs == 1
    ring = await store.client.execute("HGET", keys.history(0), good)
    assert len(decode_ring(ring)) == 1


async def test_a_late_start_checks_the_attention_list_an_on_time_one_does_not(
    store: TaskStore,
) -> None:
    """With an attention list of another kind and nothing listed before it, an ok fire on
    time writes nothing there and goes through; one that started later than the type's
    bound would list its task, so its group fails before any write."""
    good, late = (await _tasks(store, {"t": 2}))["t"]
    keys = await store.keys()
    await store.client.execute("SET", f"{keys.tag(0)}:attention:counts", "not a hash")
    scripts = await store.scripts()
    due, ledger = 1_700_000_000_000, Ledger(late_ms=1000)
    assert await scripts.record_outcomes([_ok(good, due, 5)], "t", ledger) == 1
    with pytest.raises(ResponseError, match=f"^WRONGTYPE .* \\({keys.tag(0)}:attention:counts\\)"):
        await scripts.record_outcomes([_ok(good, due + 1, 5), _ok(late, due, 5000)], "t", ledger)
    assert await store.client.execute("HGET", keys.runs(0, keys.bucket_of(late)), late) is None


async def test_a_run_record_that_cannot_be_decoded_is_that_tasks_alone(
    store: TaskStore,
) -> None:
    """Task ``bad``'s run record is cut short (a hand edit, another version): the outcome
    call writes the task beside it in full, and ``bad``'s history, but not ``bad``'s
    counts, its record left as it is (naming it in the reply); a run record Redis refuses
    to read (a bucket of another kind) fails the group before any write, as a partition
    key of another kind does."""
    tasks = await _tasks(store, {"t": 2})
    good, bad = tasks["t"]
    keys = await store.keys()
    runs_key = keys.runs(0, keys.bucket_of(bad))
    await store.client.execute("HSET", runs_key, bad, b"\xcd\x01")
    scripts = await store.scripts()
    due = 1_700_000_000_000
    assert await scripts.record_outcomes([_ok(good, due, 5), _ok(bad, due, 5)], "t") == 2
    assert await scripts.record_outcomes([_ok(good, due + 1, 5), _ok(bad, due + 1, 5)], "t") == 2
    found = await store.get(good)
    assert found is not None and found.runs == 2
    assert await store.client.execute("HGET", runs_key, bad) == b"\xcd\x01"
    assert [o.due_ms for o in await _ring(store, bad)] == [due + 1, due]
    await store.client.execute("HDEL", runs_key, bad)
    assert await scripts.record_outcomes([_ok(bad, due + 2, 5)], "t") == 1
    assert (await store.get(bad)).runs == 1  # type: ignore[union-attr]
    other = keys.runs(0, keys.bucket_of(good))
    await store.client.execute("DEL", other)
    await store.client.execute("SET", other, "not a hash")
    with pytest.raises(ResponseError, match=f"^WRONGTYPE .*run record of task {good}"):
        await scripts.record_outcomes([_ok(good, due + 3, 5)], "t")


async def test_a_late_entry_leaves_with_an_on_time_scheduled_fire_not_a_manual_one(
    store: TaskStore,
) -> None:
    """A task listed late stays listed through an ok no lateness is judged for (a retry, a
    trigger, a backfill: it says nothing of the schedule's fires) and leaves with its next
    scheduled fire on time; a dead entry leaves with any ok."""
    late_task, dead_task = (await _tasks(store, {"t": 2}))["t"]
    keys = await store.keys()
    scripts = await store.scripts()
    due, ledger = 1_700_000_000_000, Ledger(late_ms=1000)
    await scripts.record_outcomes([_ok(late_task, due, 5000)], "t", ledger)
    dead = OutcomeWrite(dead_task, 2, due + 20, "boom", due, due + 5, allowed_ms=0)
    await scripts.record_outcomes([dead], "t", ledger)
    listed = f"{keys.tag(0)}:attention"

    async def reason(task_id: str) -> str | None:
        raw = await store.client.execute("HGET", listed, task_id)
        return None if raw is None else raw.decode().split(" ")[0]

    assert (await reason(late_task), await reason(dead_task)) == ("late", "dead")
    manual = [  # origin 1: a trigger's fire, not judged (allowed_ms None)
        OutcomeWrite(t, 0, due + 50, "", due + 40, due + 41, origin=1)
        for t in (late_task, dead_task)
    ]
    await scripts.record_outcomes(manual, "t", ledger)
    assert (await reason(late_task), await reason(dead_task)) == ("late", None)
    await scripts.record_outcomes([_ok(late_task, due + 60_000, 5)], "t", ledger)
    assert await reason(late_task) is None
    counts = await store.client.execute("HGETALL", f"{keys.tag(0)}:attention:counts")
    assert all(int(v) == 0 for v in counts.values()), counts
