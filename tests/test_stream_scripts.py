"""The execution scripts called directly against a real Redis: state before, call, after."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import trio

from actors.domain.model import TaskSpec
from actors.domain.schedules import Schedule
from actors.store.enqueue import enqueue_fires
from actors.store.keys import GROUP, Keys
from actors.store.messages import Message
from actors.store.records import OUTCOME_NAMES
from actors.store.replies import DeadLetterWrite, Fire, OutcomeWrite, RetryWrite
from actors.store.scripts import Scripts
from actors.store.tasks import TaskStore
from runtime.redis_io import RedisClient


@pytest.fixture
def keys(namespace: str) -> Keys:
    return Keys(namespace, 4)


@pytest.fixture
def scripts(redis_client: RedisClient, keys: Keys) -> Scripts:
    return Scripts(redis_client, keys)


async def stream_with_group(client: RedisClient, keys: Keys, count: int) -> list[str]:
    stream = keys.queue("t")
    await client.execute("XGROUP", "CREATE", stream, GROUP, "0", "MKSTREAM")
    ids = []
    for i in range(count):
        fields = ["task_id", f"x{i}", "schedule_id", f"x{i}:1", "type", "t", "payload", "1",
                  "attempt", "0", "due_ms", "1"]  # fmt: skip
        ids.append((await client.execute("XADD", stream, "*", *fields)).decode())
    return ids


async def read_as(client: RedisClient, keys: Keys, consumer: str, count: int) -> None:
    await client.execute(
        "XREADGROUP", "GROUP", GROUP, consumer, "COUNT", count, "STREAMS", keys.queue("t"), ">"
    )


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


async def owners(client: RedisClient, keys: Keys, idle_ms: int | None = None) -> dict[str, str]:
    raw = client.raw
    pending = await client.run_sync(
        lambda: raw.xpending_range(keys.queue("t"), GROUP, "-", "+", 100, idle=idle_ms)
    )
    return {_text(p["message_id"]): _text(p["consumer"]) for p in pending}


async def consumers(client: RedisClient, keys: Keys) -> set[str]:
    raw = client.raw
    info = await client.run_sync(lambda: raw.xinfo_consumers(keys.queue("t"), GROUP))
    return {_text(c["name"]) for c in info}


async def test_ack_acknowledges_and_the_trim_drops_only_what_is_done(
    redis_client: RedisClient, keys: Keys, scripts: Scripts
) -> None:
    """An ACK leaves the entry in the stream (no XDEL a fire); the claimers' trim drops
    acknowledged entries from the head, whole listpack nodes at a time, and never one that
    is pending or not read yet."""
    ids = await stream_with_group(redis_client, keys, 3)
    await read_as(redis_client, keys, "c", 3)
    acked = await scripts.ack("t", [ids[0], ids[2]])
    assert acked == 2
    assert await owners(redis_client, keys) == {ids[1]: "c"}
    assert await redis_client.execute("XLEN", keys.queue("t")) == 3  # kept until trimmed
    # 600 more: 500 of all 603 read, the first 400 acknowledged (ids[1] stays pending).
    more = await stream_with_group_more(redis_client, keys, 600)
    await read_as(redis_client, keys, "c", 497)
    await scripts.ack("t", more[:400])
    assert await scripts.trim_acked("t") == 0  # ids[1], pending, holds the head
    await scripts.ack("t", [ids[1]])
    trimmed = await scripts.trim_acked("t")
    left = [e[0].decode() for e in await redis_client.execute("XRANGE", keys.queue("t"), "-", "+")]
    assert trimmed >= 300 and len(left) == 603 - trimmed
    assert set(more[400:]) <= set(left)  # pending (400..496) and unread (497..599) all kept
    assert await scripts.trim_acked("t") == 0  # nothing more it may take


async def test_the_trim_takes_a_backlog_larger_than_one_step(
    redis_client: RedisClient, keys: Keys, scripts: Scripts
) -> None:
    """One trim drops every acknowledged node however many there are, a step a call. With
    XTRIM's own limit for '~' (10,000 entries a call, the claimer calling once a second) a
    stream fed 20,000 fires a second grew without end."""
    stream = keys.queue("t")
    await redis_client.execute("XGROUP", "CREATE", stream, GROUP, "0", "MKSTREAM")

    async def acked(count: int) -> None:
        await redis_client.execute(
            "EVAL",
            "for i = 1, tonumber(ARGV[1]) do redis.call('XADD', KEYS[1], '*', 'task_id', 'x') end",
            1, stream, count,
        )  # fmt: skip
        reply = await redis_client.execute(
            "XREADGROUP", "GROUP", GROUP, "c", "COUNT", count, "STREAMS", stream, ">"
        )
        await scripts.ack("t", [entry[0].decode() for entry in reply[0][1]])

    await acked(12_000)
    assert await scripts.trim_acked("t") >= 11_900
    assert await redis_client.execute("XLEN", stream) <= 100  # the last-delivered one's node
    await acked(1_000)
    assert await scripts.trim_acked("t", step=250) >= 900  # several calls of about 250
    assert await redis_client.execute("XLEN", stream) <= 100
    assert await scripts.trim_acked("t", step=250) == 0


async def stream_with_group_more(client: RedisClient, keys: Keys, count: int) -> list[str]:
    fields = ["task_id", "y", "schedule_id", "y:1", "type", "t", "payload", "1", "attempt", "0",
              "due_ms", "1"]  # fmt: skip
    return [
        (await client.execute("XADD", keys.queue("t"), "*", *fields)).decode() for _ in range(count)
    ]


async def test_renew_leases_touches_only_this_consumers_messages(
    redis_client: RedisClient, keys: Keys, scripts: Scripts
) -> None:
    ids = await stream_with_group(redis_client, keys, 2)
    await read_as(redis_client, keys, "mine", 1)
    await read_as(redis_client, keys, "theirs", 1)
    renewed = await scripts.renew_leases("t", "mine", ids)
    assert renewed == [ids[0]]
    assert await owners(redis_client, keys) == {ids[0]: "mine", ids[1]: "theirs"}


async def test_release_hands_back_and_keeps_a_consumer_with_pending(
    redis_client: RedisClient, keys: Keys, scripts: Scripts
) -> None:
    ids = await stream_with_group(redis_client, keys, 2)
    await read_as(redis_client, keys, "leaving", 2)
    released, removed = await scripts.release("t", "leaving", 10**9)
    assert sorted(released) == sorted(ids)
    assert not removed  # it still has pending entries: never deleted
    assert "leaving" in await consumers(redis_client, keys)
    # Released entries look abandoned: any claimer with any lease takes them now.
    assert len(await owners(redis_client, keys, idle_ms=3_600_000)) == 2


async def test_release_hands_back_more_than_a_call_releases(
    redis_client: RedisClient, keys: Keys, scripts: Scripts
) -> None:
    """A consumer stopping with more messages pending than one script call hands back (a
    batch): every one is handed back, not the first batch alone (the rest would wait a
    lease, then count as one delivery more), and the consumer stays in the group."""
    ids = await stream_with_group(redis_client, keys, 7)
    await read_as(redis_client, keys, "leaving", 7)
    released, removed = await scripts.release("t", "leaving", 10**9, batch=3)
    assert released == ids and not removed
    assert len(await owners(redis_client, keys, idle_ms=3_600_000)) == 7
    await scripts.ack("t", ids)
    assert await scripts.release("t", "leaving", 10**9, batch=3) == ([], True)


async def test_release_leaves_the_group_when_nothing_is_pending(
    redis_client: RedisClient, keys: Keys, scripts: Scripts
) -> None:
    await stream_with_group(redis_client, keys, 1)
    await read_as(redis_client, keys, "done", 1)
    pending = await owners(redis_client, keys)
    await scripts.ack("t", list(pending))
    released, removed = await scripts.release("t", "done", 10**9)
    assert (released, removed) == ([], True)
    assert "done" not in await consumers(redis_client, keys)


async def test_prune_removes_only_idle_consumers_with_nothing_pending(
    redis_client: RedisClient, keys: Keys, scripts: Scripts
) -> None:
    ids = await stream_with_group(redis_client, keys, 1)
    await read_as(redis_client, keys, "busy", 1)  # holds a pending message
    await redis_client.execute("XGROUP", "CREATECONSUMER", keys.queue("t"), GROUP, "gone")
    await redis_client.execute("XGROUP", "CREATECONSUMER", keys.queue("t"), GROUP, "me")
    removed = await scripts.prune_consumers("t", -1, "me")
    assert removed == ["gone"]
    assert await consumers(redis_client, keys) == {"busy", "me"}
    assert await owners(redis_client, keys) == {ids[0]: "busy"}


async def test_prune_keeps_an_idle_consumer_whose_name_is_held(
    redis_client: RedisClient, keys: Keys, scripts: Scripts
) -> None:
    """A live consumer that has read nothing for a while (its reads closed by a suspect's
    turn) still holds its name: it is not removed, and its poison ends stay its own."""
    await stream_with_group(redis_client, keys, 1)
    for name in ("idle-live", "gone", "me"):
        await redis_client.execute("XGROUP", "CREATECONSUMER", keys.queue("t"), GROUP, name)
    assert await scripts.own_name("t", "idle-live", "host:1:a:tok", 60_000) == (True, None)
    ends = keys.poison_ends("t", "idle-live")
    await redis_client.execute("HSET", ends, "1-0", "packed")
    assert await scripts.prune_consumers("t", -1, "me") == ["gone"]
    assert await consumers(redis_client, keys) == {"idle-live", "me"}
    assert await redis_client.execute("HGETALL", ends) == {b"1-0": b"packed"}
    assert await redis_client.execute("EXISTS", keys.poison_ends("t", "me")) == 0
    await scripts.disown_name("t", "idle-live", "host:1:a:tok")  # gone: pruned next time
    assert await scripts.prune_consumers("t", -1, "me") == ["idle-live"]
    assert await redis_client.execute("HGETALL", keys.poison_ends("t", "me")) == {b"1-0": b"packed"}


async def test_dead_letter_moves_the_entry_atomically(
    redis_client: RedisClient, keys: Keys, scripts: Scripts
) -> None:
    ids = await stream_with_group(redis_client, keys, 1)
    await read_as(redis_client, keys, "c", 1)
    entry = {"task_id": "x0", "reason": "failed", "error": "boom"}
    dlq_ids = await scripts.dead_letter("t", [DeadLetterWrite(ids[0], entry)])
    assert len(dlq_ids) == 1
    assert await redis_client.execute("XLEN", keys.queue("t")) == 0  # moved, not only acked
    assert await owners(redis_client, keys) == {}
    ((_, fields),) = await redis_client.execute("XRANGE", keys.dlq("t"), "-", "+")
    assert fields == {b"task_id": b"x0", b"reason": b"failed", b"error": b"boom"}


def message(task_id: str, attempt: int, payload: str) -> Message:
    return Message(
        f"1-{attempt}", task_id, f"{task_id}:1", "t", payload, attempt, 1, 1, payload=None
    )


async def test_retry_contexts_claim_and_commit(
    redis_client: RedisClient, keys: Keys, scripts: Scripts
) -> None:
    # Both tasks in partition 0, so one claim sees both.
    a, b = [t for t in (f"t{i}" for i in range(100)) if keys.partition_of(t) == 0][:2]
    store = TaskStore(redis_client, keys.namespace, default_partitions=keys.partitions)
    for task_id in (a, b):  # (a retry of a task that does not exist is dropped)
        await store.create(TaskSpec("t", Schedule("interval", every_s=3600), task_id=task_id))
    await scripts.schedule_retries(
        [
            RetryWrite(message(a, 0, '{"p":1}'), 0, "boom"),
            RetryWrite(message(b, 1, "null"), 10**15, "bang"),
        ]
    )
    assert await redis_client.execute("ZCARD", keys.retry(0)) == 2
    (claim,) = await scripts.claim_retries([0], "tok", 10, 60_000)
    assert [
        (sid, f.task_id, f.type, f.payload, f.attempt, f.due_ms) for sid, f in claim.retries
    ] == [(f"{a}:1", a, "t", b'{"p":1}', 1, 1)]  # b is not due
    lost = await scripts.commit_retries("other", {0: [f"{a}:1"]})
    assert lost[0].lost == [f"{a}:1"]  # someone else's token: left alone
    committed = await scripts.commit_retries("tok", {0: [f"{a}:1"]})
    assert committed[0].lost == []
    assert committed[0].earliest_ms is not None and committed[0].earliest_ms > 10**15  # b
    assert await redis_client.execute("EXISTS", keys.retry_context_prefix(0) + f"{a}:1") == 0
    # Sent again after its reply was lost: committed already, nothing lost (no
    # retry_claim_lost line for a retry that is back in its stream).
    again = await scripts.commit_retries("tok", {0: [f"{a}:1"]})
    assert again[0].lost == [] and again[0].earliest_ms == committed[0].earliest_ms


async def test_a_failure_met_again_keeps_the_retry_its_message_wrote_and_its_claim(
    redis_client: RedisClient, keys: Keys, scripts: Scripts
) -> None:
    """A failed message whose consumer died before its ACK is run again and fails again:
    its retry, claimed by a dispatcher meanwhile, is kept as it is, claim and all, so the
    dispatcher's commit forgets it and no second claim sends that attempt again (the
    write cleared the claim, and the retry ran twice). A failure of an earlier attempt met
    late leaves a later attempt's retry as it is."""
    a = next(t for t in (f"t{i}" for i in range(100)) if keys.partition_of(t) == 0)
    store = TaskStore(redis_client, keys.namespace, default_partitions=keys.partitions)
    await store.create(TaskSpec("t", Schedule("interval", every_s=3600), task_id=a))
    failed = RetryWrite(message(a, 0, "null"), 0, "boom")
    await scripts.schedule_retries([failed])
    (claim,) = await scripts.claim_retries([0], "tok1", 10, 60_000)
    assert [sid for sid, _ in claim.retries] == [f"{a}:1"]
    await scripts.schedule_retries([RetryWrite(message(a, 0, "null"), 0, "boom again")])
    context = keys.retry_context_prefix(0) + f"{a}:1"
    assert await redis_client.execute("HGET", context, "claim") == b"tok1"
    assert (await scripts.commit_retries("tok1", {0: [f"{a}:1"]}))[0].lost == []
    (again,) = await scripts.claim_retries([0], "tok2", 10, 60_000)
    assert again.retries == []
    later = RetryWrite(message(a, 1, "null"), 10**9, "third")
    await scripts.schedule_retries([later])
    await scripts.schedule_retries([RetryWrite(message(a, 0, "null"), 0, "stale")])
    assert await redis_client.execute("HGET", context, "attempt") == b"2"
    assert await redis_client.execute("HGET", context, "last_error") == b"third"
    # The task deleted and created again under its id: its fire of that due time (a
    # backfill's) gets a retry of its own; the old task's would be dropped when claimed.
    await store.delete(a)
    await store.create(TaskSpec("t", Schedule("interval", every_s=3600), task_id=a))
    backfilled = Message("9-0", a, f"{a}:1", "t", "null", 0, 1, 1, payload=None)
    await scripts.schedule_retries([RetryWrite(backfilled, 0, "new task")])
    assert await redis_client.execute("HGET", context, "attempt") == b"1"
    (claimed,) = await scripts.claim_retries([0], "tok3", 10, 60_000)
    assert [(sid, f.attempt) for sid, f in claimed.retries] == [(f"{a}:1", 1)]


async def test_a_trigger_key_of_another_kind_is_read_as_none(
    redis_client: RedisClient, keys: Keys, scripts: Scripts
) -> None:
    """A task's last-trigger key holding another kind of value (a hand edit) fails no
    trigger: it is read as none, and written anew."""
    await redis_client.execute("RPUSH", keys.trigger_time("a"), "x")
    assert await scripts.trigger_time("a", 5000) == 5000
    assert await scripts.trigger_time("a", 5000) == 5001


async def test_record_outcomes_counts_runs_and_failures(
    redis_client: RedisClient, keys: Keys, scripts: Scripts
) -> None:
    store = TaskStore(redis_client, keys.namespace, default_partitions=keys.partitions)
    await store.create(TaskSpec("t", Schedule("interval", every_s=60), task_id="x"))
    retry, ok = OUTCOME_NAMES.index("retry"), OUTCOME_NAMES.index("ok")
    failed = [OutcomeWrite("x", retry, 4, "old"), OutcomeWrite("x", retry, 5, "boom")]
    assert await scripts.record_outcomes(failed) == 2  # two retries
    task = await store.get("x")
    assert task is not None
    assert (task.runs, task.retries, task.last_status, task.last_run_ms, task.last_error) == (
        0, 2, "retry", 5, "boom",
    )  # fmt: skip
    updated = await scripts.record_outcomes(
        [OutcomeWrite("x", ok, 6, ""), OutcomeWrite("ghost", ok, 7, "")]
    )
    assert updated == 1  # the ghost task (never created) is skipped
    task = await store.get("x")
    assert task is not None
    assert (task.runs, task.retries, task.last_status, task.last_run_ms, task.last_error) == (
        1, 0, "ok", 6, None,
    )  # fmt: skip
    # a success reset the consecutive count and forgot the error
    assert await store.get("ghost") is None


async def test_a_retry_is_due_on_redis_clock_not_the_nodes(
    redis_client: RedisClient, keys: Keys, scripts: Scripts
) -> None:
    """The consumer sends a delay, never a time: a node whose clock is an hour off still
    has its retry due 5 s after Redis's now."""
    (task,) = [t for t in (f"t{i}" for i in range(100)) if keys.partition_of(t) == 0][:1]
    before = await redis_client.time_ms()
    await scripts.schedule_retries([RetryWrite(message(task, 0, "null"), 5000, "boom")])
    after = await redis_client.time_ms()
    score = float(await redis_client.execute("ZSCORE", keys.retry(0), f"{task}:1"))
    assert before + 5000 <= score <= after + 5000
    stored = await redis_client.execute(
        "HGET", keys.retry_context_prefix(0) + f"{task}:1", "retry_at_ms"
    )
    assert int(stored) == score


async def test_a_retry_of_a_task_deleted_or_stopped_since_is_dropped(
    redis_client: RedisClient, keys: Keys, scripts: Scripts
) -> None:
    """A fire failed, its retry waits; then its task is deleted, or stopped (for good):
    the retry is dropped when it comes due, not run again. A paused task's retry runs
    (its fire had started)."""
    store = TaskStore(redis_client, keys.namespace, default_partitions=keys.partitions)
    ids = [t for t in (f"r{i}" for i in range(200)) if keys.partition_of(t) == 0][:4]
    for task_id in ids:
        await store.create(TaskSpec("t", Schedule("interval", every_s=3600), task_id=task_id))
    gone, stopped, paused, kept = ids
    await scripts.schedule_retries([RetryWrite(message(t, 0, "null"), 0, "boom") for t in ids])
    await store.delete(gone)
    await store.stop(stopped)
    await store.pause(paused)
    (claim,) = await scripts.claim_retries([0], "tok", 10, 60_000)
    assert sorted(claim.dropped) == sorted([f"{gone}:1", f"{stopped}:1"])
    assert sorted(f.task_id for _, f in claim.retries) == sorted([paused, kept])
    prefix = keys.retry_context_prefix(0)
    assert await redis_client.execute("EXISTS", prefix + f"{gone}:1", prefix + f"{stopped}:1") == 0
    assert await redis_client.execute("ZCARD", keys.retry(0)) == 2


async def test_a_retry_of_a_task_created_again_under_its_id_is_dropped(
    redis_client: RedisClient, keys: Keys, scripts: Scripts
) -> None:
    """A fire failed and its retry waits; its task is deleted and created again under the
    same id (another payload): the retry belongs to the task that failed, and is dropped
    rather than run for the new one. A retry saved by an earlier version (no ``born``) is
    not checked, and runs as before."""
    store = TaskStore(redis_client, keys.namespace, default_partitions=keys.partitions)
    again, older, kept = [t for t in (f"b{i}" for i in range(200)) if keys.partition_of(t) == 0][:3]
    for task_id in (again, older, kept):
        await store.create(TaskSpec("t", Schedule("interval", every_s=3600), task_id=task_id))
    await scripts.schedule_retries(
        [RetryWrite(message(t, 0, "null"), 0, "boom") for t in (again, older, kept)]
    )
    prefix = keys.retry_context_prefix(0)
    await redis_client.execute("HDEL", prefix + f"{older}:1", "born")  # as an earlier version
    for task_id in (again, older):
        await store.delete(task_id)
        await store.create(
            TaskSpec("t", Schedule("interval", every_s=60), task_id=task_id, payload={"new": 1})
        )
    (claim,) = await scripts.claim_retries([0], "tok", 10, 60_000)
    assert claim.dropped == [f"{again}:1"]
    assert sorted(f.task_id for _, f in claim.retries) == sorted([older, kept])
    assert await redis_client.execute("EXISTS", prefix + f"{again}:1") == 0


@pytest.mark.parametrize(
    ("field", "value"),
    [("payload", None), ("attempt", "soon"), ("due_ms", "soon"), ("due_ms", "1733580000000.5"),
     ("attempt", "1e3"), ("type", None), ("task_id", None), ("type", b"\xff\xfe"),
     ("type", "no such/type"), ("o", b"\xff")],
)  # fmt: skip
async def test_a_retry_context_this_version_cannot_run_is_named_and_left_as_it_is(
    redis_client: RedisClient, keys: Keys, scripts: Scripts, field: str,
    value: str | bytes | None,
) -> None:  # fmt: skip
    """A retry context missing a field, or with no whole number where one goes (a hand edit,
    another program; a type or policy code that is no text, or no type name): named
    ``unreadable`` and left as it is, claimed a lease on, rather than crashing the
    dispatcher at every claim (a field decoded from nothing, or from bytes no text is),
    failing every retry of its type at the enqueue, or sent to a stream no one reads; the
    partition's other retries are claimed."""
    store = TaskStore(redis_client, keys.namespace, default_partitions=keys.partitions)
    bad, kept = [t for t in (f"m{i}" for i in range(200)) if keys.partition_of(t) == 0][:2]
    for task_id in (bad, kept):
        await store.create(TaskSpec("t", Schedule("interval", every_s=3600), task_id=task_id))
    await scripts.schedule_retries(
        [RetryWrite(message(t, 0, "null"), 0, "boom") for t in (bad, kept)]
    )
    context = keys.retry_context_prefix(0) + f"{bad}:1"
    if value is not None:
        await redis_client.execute("HSET", context, field, value)
    else:
        await redis_client.execute("HDEL", context, field)
    (claim,) = await scripts.claim_retries([0], "tok", 10, 60_000)
    assert claim.unreadable == [f"{bad}:1"] and claim.dropped == []
    assert [f.task_id for _, f in claim.retries] == [kept]
    assert await redis_client.execute("EXISTS", context) == 1
    score = await redis_client.execute("ZSCORE", keys.retry(0), f"{bad}:1")
    assert float(score) > await redis_client.time_ms()  # claimed a lease on


async def test_a_retry_of_a_task_gone_under_an_id_that_is_no_text_is_dropped_not_a_crash(
    redis_client: RedisClient, keys: Keys, scripts: Scripts
) -> None:
    """Another program's retry, its schedule id bytes no text, its task gone: dropped and
    named (the bytes shown replaced), not a decode that crashed the dispatcher at every
    claim of its partition."""
    sid = b"\xff\xfe:1"
    context = keys.retry_context_prefix(0).encode() + sid
    await redis_client.execute("HSET", context, "task_id", "ghost", "type", "t", "payload",
                               "null", "attempt", "1", "due_ms", "1")  # fmt: skip
    await redis_client.execute("ZADD", keys.retry(0), 0, sid)
    (claim,) = await scripts.claim_retries([0], "tok", 10, 60_000)
    assert claim.dropped == ["\ufffd\ufffd:1"] and claim.retries == []


async def test_a_retry_claimed_again_names_every_earlier_claim_and_is_appended_once(
    redis_client: RedisClient, keys: Keys, scripts: Scripts
) -> None:
    """Dispatcher A claims a retry, appends it and dies before its commit; B claims it a
    lease later and dies before its enqueue (no markers); C's claim names both as prior,
    so its enqueue finds A's append and appends nothing: naming B alone, it appended the
    retry a second time."""
    store = TaskStore(redis_client, keys.namespace, default_partitions=keys.partitions)
    (task_id,) = [t for t in (f"p{i}" for i in range(200)) if keys.partition_of(t) == 0][:1]
    await store.create(TaskSpec("t", Schedule("interval", every_s=3600), task_id=task_id))
    await scripts.schedule_retries([RetryWrite(message(task_id, 0, "null"), 0, "boom")])
    sid = f"{task_id}:1"

    async def claim(token: str) -> Fire:
        await redis_client.execute("ZADD", keys.retry(0), 0, sid)  # its lease run out
        ((_, fire),) = (await scripts.claim_retries([0], token, 10, 60_000))[0].retries
        return fire

    first = await claim("A")
    assert first.prior == ""
    now = await redis_client.time_ms()
    assert await enqueue_fires(scripts, [first], now, "test", 60_000, "A") == 1
    assert (await claim("B")).prior == "A"
    third = await claim("C")
    assert third.prior == "B A"
    assert await enqueue_fires(scripts, [third], now, "test", 60_000, "C") == 0
    assert await redis_client.execute("XLEN", keys.queue("t")) == 1


@pytest.mark.parametrize("broken", ["def", "state"])
async def test_a_record_that_cannot_be_read_holds_back_no_retry(
    redis_client: RedisClient, keys: Keys, scripts: Scripts, broken: str
) -> None:
    """A task's definition or state record is not one any version writes (a hand edit, a
    truncated restore) while fires of its partition wait to be retried: a retry being
    saved for it, and every retry of the partition, still are, and each is claimed, the
    broken task's too (the retry carries what it runs). The claim failed for all before."""
    store = TaskStore(redis_client, keys.namespace, default_partitions=keys.partitions)
    bad, kept = [t for t in (f"u{i}" for i in range(200)) if keys.partition_of(t) == 0][:2]
    for task_id in (bad, kept):
        await store.create(TaskSpec("t", Schedule("interval", every_s=3600), task_id=task_id))
    await scripts.schedule_retries([RetryWrite(message(kept, 0, "null"), 0, "boom")])
    record = keys.definitions if broken == "def" else keys.states
    await redis_client.execute("HSET", record(0, keys.bucket_of(bad)), bad, b"\x94\xa5email")
    await scripts.schedule_retries([RetryWrite(message(bad, 0, "null"), 0, "boom")])
    (claim,) = await scripts.claim_retries([0], "tok", 10, 60_000)
    assert claim.dropped == []
    assert sorted(f.task_id for _, f in claim.retries) == sorted([bad, kept])


@pytest.mark.parametrize("window_ms", [60_000, 0])
async def test_a_rejected_partition_or_stream_holds_back_its_own_retries_only(
    redis_client: RedisClient, keys: Keys, scripts: Scripts,
    log_lines: Callable[[], list[dict[str, Any]]], window_ms: int,
) -> None:  # fmt: skip
    """One partition's retry context that Redis rejects (a key of another kind), or one
    type's stream: the retries of every other partition and type go on, each appended
    once (with or without the dedupe window's markers); the rejected ones wait, said
    once, and go once it is mended."""
    from actors.scheduling.retry_dispatcher import RetryDispatcher, RetryDispatcherSettings

    store = TaskStore(redis_client, keys.namespace, default_partitions=keys.partitions)
    ids = [f"q{i}" for i in range(60)]
    a = next(t for t in ids if keys.partition_of(t) == 0)  # its context made a string
    b = next(t for t in ids if keys.partition_of(t) == 1)
    c = next(t for t in ids if keys.partition_of(t) == 2)  # of a type whose stream is broken
    for task_id, kind in ((a, "t"), (b, "t"), (c, "u")):
        await store.create(TaskSpec(kind, Schedule("interval", every_s=3600), task_id=task_id))
    writes = [RetryWrite(message(t, 0, "null"), 0, "boom") for t in (a, b)]
    writes.append(
        RetryWrite(Message("1-9", c, f"{c}:1", "u", "null", 0, 1, 1, payload=None), 0, "x")
    )
    await scripts.schedule_retries(writes)
    context_a = keys.retry_context_prefix(0) + f"{a}:1"
    saved = await redis_client.execute("DUMP", context_a)
    await redis_client.execute("DEL", context_a)
    await redis_client.execute("SET", context_a, "not a hash")
    await redis_client.execute("SET", keys.queue("u"), "not a stream")
    settings = RetryDispatcherSettings(of=1, claim_lease_ms=300, dedupe_window_ms=window_ms)
    dispatcher = RetryDispatcher(store, settings)
    with trio.fail_after(30):
        result = await dispatcher.tick(scripts, list(range(keys.partitions)))
    assert result.enqueued == 2  # b's and c's claimed; c's held back with its stream
    entries = await redis_client.execute("XRANGE", keys.queue("t"), "-", "+")
    assert [e[1][b"task_id"] for e in entries] == [b.encode()]
    held = [e for e in log_lines() if e["event"] == "retries_held_back"]
    assert {e.get("partition") or e.get("type") for e in held} == {"0", "u"}
    # Mended: the partition's retry is claimed now; the type's after its claim's lease.
    await redis_client.execute("DEL", context_a, keys.queue("u"))
    await redis_client.execute("RESTORE", context_a, 0, saved)
    await dispatcher.tick(scripts, list(range(keys.partitions)))
    entries = await redis_client.execute("XRANGE", keys.queue("t"), "-", "+")
    assert sorted(e[1][b"task_id"] for e in entries) == sorted([a.encode(), b.encode()])
    resumed = [e for e in log_lines() if e["event"] == "retries_resumed"]
    assert {e.get("partition") or e.get("type") for e in resumed} == {"0"}
    assert await redis_client.execute("ZSCORE", keys.retry(2), f"{c}:1") is not None  # kept
    await trio.sleep(0.4)  # its claim's lease over: claimed again, appended
    await dispatcher.tick(scripts, list(range(keys.partitions)))
    (entry,) = await redis_client.execute("XRANGE", keys.queue("u"), "-", "+")
    assert entry[1][b"task_id"] == c.encode()
    resumed = [e for e in log_lines() if e["event"] == "retries_resumed"]
    assert {e.get("partition") or e.get("type") for e in resumed} == {"0", "u"}
    assert await redis_client.execute("ZCARD", keys.retry(2)) == 0  # committed
