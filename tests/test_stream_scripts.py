"""The execution scripts called directly against a real Redis: state before, call, after."""

from __future__ import annotations

from typing import Any

import pytest

from actors.domain.model import TaskSpec
from actors.domain.schedules import Schedule
from actors.store import scripts
from actors.store.keys import GROUP, Keys
from actors.store.tasks import TaskStore
from runtime.redis_io import RedisClient


@pytest.fixture
def keys(namespace: str) -> Keys:
    return Keys(namespace, 4)


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


async def test_ack_acknowledges_and_deletes(redis_client: RedisClient, keys: Keys) -> None:
    ids = await stream_with_group(redis_client, keys, 3)
    await read_as(redis_client, keys, "c", 3)
    acked = await redis_client.script(scripts.ACK, [keys.queue("t")], [GROUP, ids[0], ids[2]])
    assert acked == 2
    assert await owners(redis_client, keys) == {ids[1]: "c"}
    assert await redis_client.execute("XLEN", keys.queue("t")) == 1


async def test_renew_leases_touches_only_this_consumers_messages(
    redis_client: RedisClient, keys: Keys
) -> None:
    ids = await stream_with_group(redis_client, keys, 2)
    await read_as(redis_client, keys, "mine", 1)
    await read_as(redis_client, keys, "theirs", 1)
    renewed = await redis_client.script(
        scripts.RENEW_LEASES, [keys.queue("t")], [GROUP, "mine", *ids]
    )
    assert [r.decode() for r in renewed] == [ids[0]]
    assert await owners(redis_client, keys) == {ids[0]: "mine", ids[1]: "theirs"}


async def test_release_hands_back_and_keeps_a_consumer_with_pending(
    redis_client: RedisClient, keys: Keys
) -> None:
    ids = await stream_with_group(redis_client, keys, 2)
    await read_as(redis_client, keys, "leaving", 2)
    released, removed = await redis_client.script(
        scripts.RELEASE, [keys.queue("t")], [GROUP, "leaving", 10**9]
    )
    assert sorted(r.decode() for r in released) == sorted(ids)
    assert removed == 0  # it still has pending entries: never deleted
    assert "leaving" in await consumers(redis_client, keys)
    # Released entries look abandoned: any claimer with any lease takes them now.
    assert len(await owners(redis_client, keys, idle_ms=3_600_000)) == 2


async def test_release_leaves_the_group_when_nothing_is_pending(
    redis_client: RedisClient, keys: Keys
) -> None:
    await stream_with_group(redis_client, keys, 1)
    await read_as(redis_client, keys, "done", 1)
    pending = await owners(redis_client, keys)
    await redis_client.script(scripts.ACK, [keys.queue("t")], [GROUP, *pending])
    released, removed = await redis_client.script(
        scripts.RELEASE, [keys.queue("t")], [GROUP, "done", 10**9]
    )
    assert (released, removed) == ([], 1)
    assert "done" not in await consumers(redis_client, keys)


async def test_prune_removes_only_idle_consumers_with_nothing_pending(
    redis_client: RedisClient, keys: Keys
) -> None:
    ids = await stream_with_group(redis_client, keys, 1)
    await read_as(redis_client, keys, "busy", 1)  # holds a pending message
    await redis_client.execute("XGROUP", "CREATECONSUMER", keys.queue("t"), GROUP, "gone")
    await redis_client.execute("XGROUP", "CREATECONSUMER", keys.queue("t"), GROUP, "me")
    removed = await redis_client.script(
        scripts.PRUNE_CONSUMERS, [keys.queue("t")], [GROUP, -1, "me"]
    )
    assert [r.decode() for r in removed] == ["gone"]
    assert await consumers(redis_client, keys) == {"busy", "me"}
    assert await owners(redis_client, keys) == {ids[0]: "busy"}


async def test_dead_letter_moves_the_entry_atomically(
    redis_client: RedisClient, keys: Keys
) -> None:
    ids = await stream_with_group(redis_client, keys, 1)
    await read_as(redis_client, keys, "c", 1)
    entry = ["task_id", "x0", "reason", "failed", "error", "boom"]
    dlq_ids = await redis_client.script(
        scripts.DEAD_LETTER,
        [keys.queue("t"), keys.dlq("t")],
        [GROUP, ids[0], len(entry), *entry],
    )
    assert len(dlq_ids) == 1
    assert await redis_client.execute("XLEN", keys.queue("t")) == 0
    assert await owners(redis_client, keys) == {}
    ((_, fields),) = await redis_client.execute("XRANGE", keys.dlq("t"), "-", "+")
    assert fields == {b"task_id": b"x0", b"reason": b"failed", b"error": b"boom"}


async def test_retry_contexts_claim_and_commit(redis_client: RedisClient, keys: Keys) -> None:
    prefix, zset = keys.retry_context_prefix(0), keys.retry(0)
    saved = await redis_client.script(
        scripts.SCHEDULE_RETRIES, [zset],
        [prefix, "a:1", 1, "a", "t", '{"p":1}', 1, 1, "boom",
         "b:1", 10**15, "b", "t", "null", 2, 1, "bang"],
    )  # fmt: skip
    assert saved == 2
    reply: list[Any] = await redis_client.script(
        scripts.CLAIM_RETRIES, [zset], [prefix, "tok", 10, 60_000]
    )
    claimed = reply[2:]
    assert [x.decode() for x in claimed] == ["a:1", "a", "t", '{"p":1}', "1", "1"]  # b not due
    lost = await redis_client.script(scripts.COMMIT_RETRIES, [zset], [prefix, "other", "a:1"])
    assert [x.decode() for x in lost[1:]] == ["a:1"]  # someone else's token: left alone
    committed = await redis_client.script(scripts.COMMIT_RETRIES, [zset], [prefix, "tok", "a:1"])
    assert committed == [10**15]  # only b remains, scored far ahead
    assert await redis_client.execute("EXISTS", prefix + "a:1") == 0


async def test_record_outcomes_counts_runs_and_failures(
    redis_client: RedisClient, keys: Keys
) -> None:
    store = TaskStore(redis_client, keys.namespace, default_partitions=keys.partitions)
    await store.create(TaskSpec("t", Schedule("interval", every_s=60), task_id="x"))
    b = keys.bucket_of("x")
    tag = keys.tag(keys.partition_of("x"))
    zset = [keys.schedule(keys.partition_of("x"))]
    failed = [tag, "x", b, 1, 4, "old", "x", b, 1, 5, "boom"]  # two retries
    assert await redis_client.script(scripts.RECORD_OUTCOMES, zset, failed) == 2
    task = await store.get("x")
    assert task is not None
    assert (task.runs, task.retries, task.last_status, task.last_run_ms, task.last_error) == (
        0, 2, "retry", 5, "boom",
    )  # fmt: skip
    ghost = keys.bucket_of("ghost")
    args = [tag, "x", b, 0, 6, "", "ghost", ghost, 0, 7, ""]
    updated = await redis_client.script(scripts.RECORD_OUTCOMES, zset, args)
    assert updated == 1  # the ghost task (never created) is skipped
    task = await store.get("x")
    assert task is not None
    assert (task.runs, task.retries, task.last_status, task.last_run_ms, task.last_error) == (
        1, 0, "ok", 6, None,
    )  # fmt: skip
    # a success reset the consecutive count and forgot the error
    assert await store.get("ghost") is None
