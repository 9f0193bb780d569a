"""A poller's definitions kept by task version (``actors.store.definitions``): a claim
with the cache reads each definition once per version, every API write is seen at the
next claim, and a task deleted and created again never passes for the old one."""

from __future__ import annotations

import json
from typing import Any

import pytest

from actors.domain.model import TaskSpec
from actors.domain.schedules import Schedule
from actors.store.claim_replies import LeanClaim, add_read_definitions
from actors.store.definitions import Definition, DefinitionCache
from actors.store.records import encode_definition, encode_schedule, encode_state
from actors.store.replies import PartitionClaim
from actors.store.tasks import TaskStore
from runtime.redis_io import RedisClient

_tokens = iter(range(1, 10**9))
#: Due now, and again within a minute: a definition worth keeping.
EVERY_MINUTE = Schedule("interval", every_s=60, start_ms=0)


@pytest.fixture
async def store(redis_client: RedisClient, namespace: str) -> TaskStore:
    return TaskStore(redis_client, namespace, default_partitions=1)


async def claimed_payloads(store: TaskStore, cache: DefinitionCache | None) -> dict[str, object]:
    """Partition 0 claimed under a fresh token: each claimed task's payload (what the
    poller would put in its message)."""
    scripts = await store.scripts()
    token = f"A-{next(_tokens)}"
    (claim,) = await scripts.claim_due([0], "A", token, 100, 60_000, definitions=cache)
    return {t.task_id: json.loads(t.payload) for t in claim.tasks}


async def rewrite_definition_behind_the_api(
    store: TaskStore, task_id: str, payload: object
) -> None:
    """The stored definition changed without an API write (so without a new version)."""
    keys = await store.keys()
    raw = encode_definition("t", json.dumps(payload), encode_schedule(EVERY_MINUTE), 0)
    await store.client.execute("HSET", keys.definitions(0, keys.bucket_of(task_id)), task_id, raw)


async def test_a_claim_with_the_cache_reads_a_definition_once_per_version(store: TaskStore) -> None:
    await store.create(TaskSpec("t", EVERY_MINUTE, {"v": 1}, task_id="a"))
    cache = DefinitionCache(100)
    assert await claimed_payloads(store, cache) == {"a": {"v": 1}}  # read, and kept
    assert len(cache) == 1
    await rewrite_definition_behind_the_api(store, "a", {"v": 2})
    assert await claimed_payloads(store, None) == {"a": {"v": 2}}  # what is stored now
    # same version: the kept definition, not read again
    assert await claimed_payloads(store, cache) == {"a": {"v": 1}}
    await store.update("a", payload={"v": 3})  # an API write: a new version
    assert await claimed_payloads(store, cache) == {"a": {"v": 3}}
    assert await claimed_payloads(store, cache) == {"a": {"v": 3}}


async def test_a_task_created_again_under_its_id_gets_a_later_version(store: TaskStore) -> None:
    """Within one millisecond too: versions come from the partition's last one, not only
    from the clock (here the partition's is set far ahead, as if many writes had just
    happened), so the kept definition of the deleted task never passes for the new one."""
    await store.create(TaskSpec("t", EVERY_MINUTE, {"v": 1}, task_id="a"))
    cache = DefinitionCache(100)
    assert await claimed_payloads(store, cache) == {"a": {"v": 1}}
    keys = await store.keys()
    ahead = await store.now_ms() + 10**9
    await store.client.execute("HSET", keys.partition_owner(0), "version", ahead)
    assert await store.delete("a")
    await store.create(TaskSpec("t", EVERY_MINUTE, {"v": 2}, task_id="a"))
    task = await store.get("a")
    assert task is not None and task.updated_ms == task.created_ms == ahead + 1
    assert await claimed_payloads(store, cache) == {"a": {"v": 2}}
    await store.update("a", payload={"v": 3})
    task = await store.get("a")
    assert task is not None and task.updated_ms == ahead + 2


def test_a_definition_read_after_its_task_changed_is_left_for_the_next_tick() -> None:
    definition = encode_definition("t", "{}", encode_schedule(EVERY_MINUTE), 1000)
    claimed = [0, 5000, 0, 1000, 0, None, None, None, None]  # version 1000 when claimed
    lean = LeanClaim(PartitionClaim(0, 6000, 5000, []), [("a", 3, claimed)], -1, "")
    moved = encode_state("active", 5000, 0, 1001, 0, 0, None, None)  # updated since
    assert add_read_definitions(lean, [definition, moved, b"0"]) == []
    assert lean.claim.tasks == []
    assert add_read_definitions(lean, [None, None, b"0"]) == []  # deleted since
    assert lean.claim.tasks == []
    same = encode_state("active", 5000, 0, 1000, 0, 0, None, None)
    ((kept_id, kept_version, kept),) = add_read_definitions(lean, [definition, same, b"0"])
    (task,) = lean.claim.tasks
    assert (task.task_id, task.bucket, task.type, task.due_ms, task.updated_ms) == (
        "a", 3, "t", 5000, 1000,
    )  # fmt: skip
    assert (kept_id, kept_version, kept.type) == ("a", 1000, "t")  # the version claimed


def test_the_cache_keeps_at_most_its_limit_and_sweeps_out_what_is_not_used() -> None:
    schedule = Schedule("once", at_ms=0)
    cache = DefinitionCache(4)

    def put(task_id: str, version: int = 1) -> None:
        cache.put(0, task_id, version, Definition("t", b"{}", schedule))

    for task_id in "abcd":
        put(task_id)
    put("e")  # full: turned away, and a sweep finds everything used since it was read
    assert len(cache) == 4 and cache.get(0, "e", 1) is None
    assert cache.get(0, "a", 1) is not None and cache.get(0, "b", 1) is not None
    put("e")  # a sweep: c and d were not used since the last one
    put("f")
    assert len(cache) == 4
    assert [t for t in "abcdef" if cache.get(0, t, 1)] == ["a", "b", "e", "f"]
    put("a", 2)  # a new version replaces the old one in place
    assert cache.get(0, "a", 1) is None and cache.get(0, "a", 2) is not None
    cache.put(1, "x", 1, Definition("t", b"{}", schedule))  # full again
    cache.forget(0)
    assert len(cache) == 0
    cache.put(1, "x", 1, Definition("t", b"{}", schedule))
    assert cache.get(1, "x", 1) is not None and len(cache) == 1


async def test_only_tasks_that_fire_again_soon_are_kept(store: TaskStore) -> None:
    """A once task never comes back, and an hourly one would hold memory for a read saved
    an hour later: both are claimed with their definitions, neither is kept."""
    hourly = Schedule("interval", every_s=3600, start_ms=0)
    await store.create_many(
        [
            TaskSpec("t", Schedule("once", at_ms=0), {"v": "once"}, task_id="once"),
            TaskSpec("t", hourly, {"v": "hourly"}, task_id="hourly"),
            TaskSpec("t", Schedule("interval", every_s=300, start_ms=0), {"v": 5}, task_id="5min"),
        ]
    )
    cache = DefinitionCache(100)
    assert await claimed_payloads(store, cache) == {
        "once": {"v": "once"}, "hourly": {"v": "hourly"}, "5min": {"v": 5},
    }  # fmt: skip
    assert len(cache) == 1  # the one due again within five minutes
    assert await claimed_payloads(store, cache) == {
        "once": {"v": "once"}, "hourly": {"v": "hourly"}, "5min": {"v": 5},
    }  # fmt: skip


def test_a_state_without_definition_is_named_only_if_it_would_fire() -> None:
    """A claim that left the states out finds, reading a missed task's records, a state and
    no definition: named unreadable if the state is active and due, a stale schedule entry
    (left as the claims that read states leave one) if it is not."""
    paused = encode_state("paused", 5000, 0, 1000, 0, 0, None, None)
    active = encode_state("active", 5000, 0, 1000, 0, 0, None, None)
    foreign = b"\x07" + active[1:]  # a status no version writes
    ended = encode_state("active", None, 0, 1000, 0, 0, None, None)  # no next time
    misses: list[tuple[str, int, list[Any] | None]] = [
        ("p", 3, None), ("a", 4, None), ("f", 5, None), ("e", 6, None),
    ]  # fmt: skip
    lean = LeanClaim(PartitionClaim(0, 6000, 5000, []), misses, -1, "")
    read = [None, paused, None, active, None, foreign, None, ended, b"0"]
    assert add_read_definitions(lean, read) == []
    assert [task_id for task_id, _ in lean.claim.unreadable] == ["a", "f"]
