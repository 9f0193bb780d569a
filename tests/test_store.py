"""Task store operations against a real Redis: outcomes are read back from Redis."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any
from unittest.mock import ANY

import pytest
import trio
from redis.exceptions import ResponseError

from actors.domain.errors import (
    InvalidTask,
    InvalidTransition,
    LayoutMismatch,
    TaskConflict,
    TaskNotFound,
)
from actors.domain.model import Task, TaskSpec, parse_spec
from actors.domain.schedules import Schedule
from actors.store.keys import Keys
from actors.store.labels import MAX_LIST_READ
from actors.store.tasks import TaskStore
from runtime.redis_io import RedisClient

EVERY_MINUTE = Schedule("interval", every_s=60)


@pytest.fixture
async def store(redis_client: RedisClient, namespace: str) -> TaskStore:
    return TaskStore(redis_client, namespace, default_partitions=4)


async def namespace_keys(client: RedisClient, namespace: str) -> list[str]:
    """Every key of the namespace (SCAN is fine in a test)."""
    cursor, found = 0, []
    while True:
        cursor, batch = await client.execute(
            "SCAN", cursor, "MATCH", f"*{namespace}*", "COUNT", 1000
        )
        found += [k.decode() for k in batch]
        if int(cursor) == 0:
            return sorted(found)


async def in_schedule(store: TaskStore, task_id: str) -> float | None:
    keys = await store.keys()
    score = await store.client.execute("ZSCORE", keys.schedule(keys.partition_of(task_id)), task_id)
    return float(score) if score is not None else None


async def test_create_then_get(store: TaskStore) -> None:
    before = await store.now_ms()
    created = await store.create(TaskSpec("email", EVERY_MINUTE, {"to": "a@b.c"}))
    assert created.created
    task = await store.get(created.task_id)
    assert task is not None
    assert (task.type, task.payload, task.status) == ("email", {"to": "a@b.c"}, "active")
    assert task.next_run_ms is not None and before <= task.next_run_ms <= before + 1000
    assert task.created_ms == task.updated_ms
    assert (task.fires, task.runs, task.retries) == (0, 0, 0)
    assert await in_schedule(store, created.task_id) == task.next_run_ms


async def test_create_with_client_id_is_idempotent(store: TaskStore) -> None:
    spec = TaskSpec("email", EVERY_MINUTE, {"n": 1}, task_id="daily-report")
    assert (await store.create(spec)).created
    again = await store.create(spec)
    assert again.task_id == "daily-report"
    assert not again.created


async def test_create_conflicting_definition_changes_nothing(store: TaskStore) -> None:
    await store.create(TaskSpec("email", EVERY_MINUTE, {"n": 1}, task_id="t1"))
    with pytest.raises(TaskConflict, match="t1"):
        await store.create(TaskSpec("email", EVERY_MINUTE, {"n": 2}, task_id="t1"))
    task = await store.get("t1")
    assert task is not None and task.payload == {"n": 1}


async def test_bulk_create_spreads_over_partitions(store: TaskStore, namespace: str) -> None:
    specs = [TaskSpec("sms", EVERY_MINUTE, i) for i in range(2000)]
    created = await store.create_many(specs)
    assert len({c.task_id for c in created}) == 2000
    keys = await store.keys()
    sizes = [
        sum(
            await store.client.pipeline(
                [("HLEN", keys.by_type(p, "sms", b)) for b in range(keys.buckets)]
            )
        )
        for p in range(4)
    ]
    assert sum(sizes) == 2000
    assert min(sizes) > 300  # hashed, not piled into one partition
    zsizes = [int(await store.client.execute("ZCARD", keys.schedule(p))) for p in range(4)]
    assert sum(zsizes) == 2000
    assert await store.types() == ["sms"]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"type": "a b", "schedule": {"kind": "once", "at_ms": 1}}, "type 'a b' must be"),
        ({"type": "x{y}", "schedule": {"kind": "once", "at_ms": 1}}, "type 'x{y}' must be"),
        (
            {"type": "ok", "task_id": "../etc", "schedule": {"kind": "once", "at_ms": 1}},
            "task_id '../etc' must be",
        ),
        (
            {"type": "ok", "schedule": {"kind": "once", "at_ms": 1}, "payload": "x" * 70_000},
            "payload: 70002 bytes as JSON, more than the 65536 allowed",
        ),
        ({"type": "ok", "schedule": {"kind": "interval"}}, "schedule.every_s: required"),
        ({"type": "ok"}, "schedule: required key missing"),
        ({"type": "ok", "schedule": {"kind": "once", "at_ms": 1}, "colour": 1}, "unknown key"),
    ],
)
async def test_bad_definitions_are_refused_and_write_nothing(
    store: TaskStore, redis_client: RedisClient, namespace: str, spec: dict[str, Any], message: str
) -> None:
    with pytest.raises(InvalidTask) as info:
        await store.create(parse_spec(spec))
    assert message in str(info.value)
    assert await namespace_keys(redis_client, namespace) == []


async def test_duplicate_ids_in_one_bulk_write_nothing(
    store: TaskStore, redis_client: RedisClient, namespace: str
) -> None:
    spec = TaskSpec("email", EVERY_MINUTE, task_id="same")
    with pytest.raises(InvalidTask, match="twice"):
        await store.create_many([spec, spec])
    assert await namespace_keys(redis_client, namespace) == [f"{namespace}:meta"]


async def test_list_pages_with_a_cursor_and_filters(store: TaskStore) -> None:
    # Fixed ids: which buckets the tasks land in (so how pages split) is the same every run.
    a = await store.create_many(
        [TaskSpec("a", EVERY_MINUTE, i, task_id=f"a{i}") for i in range(230)]
    )
    await store.create_many([TaskSpec("b", EVERY_MINUTE, i) for i in range(40)])
    for created in a[:7]:
        await store.pause(created.task_id)
    seen: list[str] = []
    cursor = None
    pages = 0
    while True:
        page, cursor = await store.list_tasks(task_type="a", cursor=cursor, limit=50)
        seen += [t.task_id for t in page]
        pages += 1
        if cursor is None:
            break
    assert pages > 2
    assert sorted(seen) == sorted(c.task_id for c in a)  # each once
    paused, _ = await store.list_tasks(task_type="a", status="paused", limit=1000)
    assert sorted(t.task_id for t in paused) == sorted(c.task_id for c in a[:7])
    everything, cursor = await store.list_tasks(limit=1000)
    assert cursor is None
    assert len({t.task_id for t in everything}) == 270


async def test_no_page_holds_more_than_its_limit_and_each_task_is_listed_once(
    store: TaskStore,
) -> None:
    """A page that fills inside a bucket ends there, its cursor naming the last id listed:
    the next page starts after it in that bucket (whole buckets, read fourfold a round
    trip, overran ``limit`` = 1 by dozens)."""
    a = await store.create_many(
        [TaskSpec("a", EVERY_MINUTE, i, task_id=f"a{i}", labels={"k": "v"}) for i in range(300)]
    )
    b = await store.create_many([TaskSpec("b", EVERY_MINUTE, i) for i in range(40)])
    cases: list[tuple[dict[str, Any], list[Any]]] = [
        ({"task_type": "a"}, a),
        ({"labels": {"k": "v"}}, a),
        ({}, a + b),
    ]
    for filters, created in cases:
        for limit in (1, 7, 64):
            seen: list[str] = []
            cursor = None
            while True:
                page, cursor = await store.list_tasks(cursor=cursor, limit=limit, **filters)
                assert len(page) <= limit, (filters, limit, len(page))
                seen += [t.task_id for t in page]
                if cursor is None:
                    break
            assert sorted(seen) == sorted(c.task_id for c in created), (filters, limit)


async def test_a_task_whose_records_cannot_be_read_is_named_once_across_pages(
    store: TaskStore,
) -> None:
    """Pages ending inside a bucket: a task that cannot be read is named by the page that
    went past it, not also by the one before (its round trip read it too)."""
    created = await store.create_many(
        [TaskSpec("a", EVERY_MINUTE, i, task_id=f"u{i}") for i in range(120)]
    )
    keys = await store.keys()
    bad = [c.task_id for c in created[::9]]
    for task_id in bad:
        definitions = keys.definitions(keys.partition_of(task_id), keys.bucket_of(task_id))
        await store.client.execute("HSET", definitions, task_id, b"\xc1\xc1")
    listed: list[str] = []
    named: list[str] = []
    cursor = None
    while True:
        unreadable: list[tuple[str, str]] = []
        page, cursor = await store.list_tasks(
            task_type="a", cursor=cursor, limit=5, unreadable=unreadable
        )
        listed += [t.task_id for t in page]
        named += [task_id for task_id, _ in unreadable]
        if cursor is None:
            break
    assert sorted(named) == sorted(bad)
    assert sorted(listed) == sorted(c.task_id for c in created if c.task_id not in bad)


async def test_a_few_tasks_are_listed_in_one_page_with_the_default_buckets(
    redis_client: RedisClient, namespace: str
) -> None:
    """16 partitions x 1024 buckets, nearly all empty: still one page, no cursor."""
    store = TaskStore(redis_client, namespace)
    ids = [c.task_id for c in await store.create_many(
        [TaskSpec(kind, EVERY_MINUTE) for kind in ("a", "b", "b")]
    )]  # fmt: skip
    everything, cursor = await store.list_tasks()
    assert cursor is None and sorted(t.task_id for t in everything) == sorted(ids)
    only_b, cursor = await store.list_tasks(task_type="b")
    assert cursor is None and sorted(t.task_id for t in only_b) == sorted(ids[1:])


class CountingReads(TaskStore):
    """The real store, counting the tasks each listing call reads."""

    reads = 0

    async def get_many(
        self, task_ids: Sequence[str], unreadable: list[tuple[str, str]] | None = None
    ) -> list[Task | None]:
        self.reads += len(task_ids)
        return await super().get_many(task_ids, unreadable)


async def test_a_rare_status_is_listed_in_calls_that_each_read_a_bounded_number(
    redis_client: RedisClient, namespace: str
) -> None:
    """A filter that keeps one task of many: each call reads about ``MAX_LIST_READ`` tasks
    and answers what it found with a cursor, and following the cursors finds the one. A
    sparse type read first (its empty buckets grow the read-ahead) does not make the first
    call on a dense type read a whole partition."""
    store = CountingReads(redis_client, namespace, 1, 64)
    await store.create_many([TaskSpec("a-sparse", EVERY_MINUTE) for _ in range(3)])
    created = await store.create_many(
        [TaskSpec("b-dense", EVERY_MINUTE, task_id=f"m{i}") for i in range(3 * MAX_LIST_READ)]
    )
    rare = created[-1].task_id
    await store.pause(rare)
    found: list[str] = []
    cursor: str | None = None
    reads: list[int] = []
    while True:
        store.reads = 0
        page, cursor = await store.list_tasks(status="paused", cursor=cursor)
        reads.append(store.reads)
        found += [t.task_id for t in page]
        if cursor is None:
            break
    assert found == [rare]
    assert sum(reads) == 3 * MAX_LIST_READ + 3
    # Each call stops after about MAX_LIST_READ: past it by at most one round trip, which
    # reads no more than what was left of it (a 64-bucket partition holds 15,000).
    assert len(reads) >= 3 and max(reads) < 2 * MAX_LIST_READ, reads


async def test_list_refuses_bad_filters(store: TaskStore) -> None:
    with pytest.raises(InvalidTask, match="status"):
        await store.list_tasks(status="sleeping")
    await store.create(TaskSpec("a", EVERY_MINUTE))
    with pytest.raises(InvalidTask, match="cursor"):
        await store.list_tasks(cursor="banana")


async def test_update_payload_and_schedule(store: TaskStore) -> None:
    created = await store.create(TaskSpec("email", EVERY_MINUTE, {"v": 1}))
    await store.update(created.task_id, payload={"v": 2})
    task = await store.get(created.task_id)
    assert task is not None and task.payload == {"v": 2} and task.schedule == EVERY_MINUTE
    later = await store.now_ms() + 3_600_000
    await store.update(created.task_id, schedule=Schedule("once", at_ms=later))
    task = await store.get(created.task_id)
    assert task is not None
    assert task.next_run_ms == later
    assert await in_schedule(store, created.task_id) == later
    assert task.updated_ms >= task.created_ms


async def test_an_update_that_sends_the_schedule_as_it_is_leaves_the_grid_alone(
    store: TaskStore,
) -> None:
    """A client that sends the whole task to change its payload sends its schedule again:
    the next fire, its index score and the status stay (placed anew, the grid would move
    to now; a finished task would fire its last time again, its max_runs counted afresh)."""
    capped = Schedule("interval", every_s=60, max_runs=5)
    created = await store.create(TaskSpec("email", capped, {"v": 1}))
    before = await store.get(created.task_id)
    assert before is not None
    score = await in_schedule(store, created.task_id)
    await trio.sleep(0.05)  # a later now: a placement anew would give another next time
    assert await store.update(created.task_id, payload={"v": 2}, schedule=capped) == "active"
    after = await store.get(created.task_id)
    assert after is not None and after.payload == {"v": 2}
    assert after.next_run_ms == before.next_run_ms
    assert await in_schedule(store, created.task_id) == score
    from actors.store.codes import STATE_VALUES
    from actors.store.records import advanced_values, pack_values, unpack

    keys = await store.keys()
    p, b = keys.partition_of(created.task_id), keys.bucket_of(created.task_id)
    state = await store.client.execute("HGET", keys.states(p, b), created.task_id)
    finished = advanced_values(unpack(state, STATE_VALUES), None, 5)  # as its commit wrote
    await store.client.execute("HSET", keys.states(p, b), created.task_id, pack_values(finished))
    await store.client.execute("ZREM", keys.schedule(p), created.task_id)
    assert await store.update(created.task_id, payload={"v": 3}, schedule=capped) == "finished"
    assert await in_schedule(store, created.task_id) is None
    # an allow_all task's flight record (its dead streak) stays too: nothing was placed
    flights = keys.flights(p)
    await store.client.execute("HSET", flights, created.task_id, "||2|||")
    await store.update(created.task_id, payload={"v": 4}, schedule=capped)
    assert await store.client.execute("HGET", flights, created.task_id) == b"||2|||"


async def test_a_payload_stored_deeper_than_clients_may_send_still_fires(
    store: TaskStore,
) -> None:
    """The depth limit is for payloads clients send: one an earlier version stored deeper
    still fires when triggered (its trigger sends no payload)."""
    from actors.domain.model import MAX_PAYLOAD_DEPTH
    from actors.domain.schedules import Schedule as Sched
    from actors.store.records import encode_definition, encode_schedule

    created = await store.create(TaskSpec("email", EVERY_MINUTE, {"v": 1}))
    deep: Any = 1
    for _ in range(MAX_PAYLOAD_DEPTH + 20):
        deep = [deep]
    task = await store.get(created.task_id)
    assert task is not None
    keys = await store.keys()
    p, b = keys.partition_of(created.task_id), keys.bucket_of(created.task_id)
    definition = encode_definition(
        "email", json.dumps(deep, separators=(",", ":")), encode_schedule(Sched(
            "interval", every_s=60)), task.created_ms,
    )  # fmt: skip
    await store.client.execute("HSET", keys.definitions(p, b), created.task_id, definition)
    _, queued = await store.trigger(created.task_id)
    assert queued
    with pytest.raises(InvalidTask, match="nested deeper"):
        await store.update(created.task_id, payload=deep)


async def test_a_trigger_under_a_policy_that_is_none_is_invalid_and_writes_nothing(
    store: TaskStore,
) -> None:
    """A store script's typo (``Skip``) is an InvalidTask naming the field, before anything
    is written; it was a KeyError, which reads as TaskNotFound (a KeyError too)."""
    spec = TaskSpec("email", Schedule("interval", every_s=60, overlap="skip"), task_id="typo")
    await store.create(spec)
    before = await store.client.execute("DBSIZE")
    with pytest.raises(InvalidTask, match="overlap: must be one of") as refused:
        await store.trigger("typo", "Skip")  # type: ignore[arg-type]
    assert not isinstance(refused.value, KeyError)
    assert await store.client.execute("DBSIZE") == before


async def test_update_of_a_missing_task_is_not_found(store: TaskStore) -> None:
    with pytest.raises(TaskNotFound):
        await store.update("ghost", payload=1)


async def test_pause_resume_stop(store: TaskStore) -> None:
    task_id = (await store.create(TaskSpec("email", EVERY_MINUTE))).task_id
    assert await store.pause(task_id) == "paused"
    assert await in_schedule(store, task_id) is None
    assert await store.pause(task_id) == "paused"  # idempotent
    assert await store.resume(task_id) == "active"
    assert await in_schedule(store, task_id) is not None
    assert await store.stop(task_id) == "stopped"
    assert await in_schedule(store, task_id) is None
    with pytest.raises(InvalidTransition, match="cannot resume a stopped task"):
        await store.resume(task_id)
    with pytest.raises(TaskNotFound):
        await store.pause("ghost")


async def test_resume_continues_on_the_grid(store: TaskStore) -> None:
    start = await store.now_ms() - 10_500
    task_id = (
        await store.create(TaskSpec("t", Schedule("interval", every_s=1, start_ms=start)))
    ).task_id
    await store.pause(task_id)
    await store.resume(task_id)
    task = await store.get(task_id)
    assert task is not None and task.next_run_ms is not None
    assert (task.next_run_ms - start) % 1000 == 0
    assert task.next_run_ms > await store.now_ms() - 1000


async def test_delete_removes_the_task_and_its_index_entries(
    store: TaskStore, redis_client: RedisClient, namespace: str
) -> None:
    task_id = (await store.create(TaskSpec("email", EVERY_MINUTE))).task_id
    assert await store.delete(task_id)
    assert not await store.delete(task_id)
    assert await store.get(task_id) is None
    keys = await store.keys()
    owner = keys.partition_owner(keys.partition_of(task_id))
    # what is left is the namespace's and the partition's, not the task's: the partition's
    # owner hash counts the writes to its tasks (the create and the delete) and keeps the
    # last version it gave (a task created again under this id gets a later one)
    assert await namespace_keys(redis_client, namespace) == sorted(
        [f"{namespace}:meta", f"{namespace}:types", owner]
    )
    assert sorted(await redis_client.execute("HGETALL", owner)) == [b"version", b"writes"]
    assert await redis_client.execute("HGET", owner, "writes") == b"2"


async def test_a_task_whose_definition_cannot_be_read_is_deleted_and_its_id_freed(
    store: TaskStore, redis_client: RedisClient, namespace: str
) -> None:
    """A definition record no version writes (a hand edit, a truncated restore): an update
    says which record is broken and how out, a create under its id is a conflict (the
    script failed the whole create call), and a delete takes every record of the task
    (it failed too, so nothing could remove such a task), after which the id is free."""
    task_id = (await store.create(TaskSpec("email", EVERY_MINUTE, task_id="broken"))).task_id
    keys = await store.keys()
    p, b = keys.partition_of(task_id), keys.bucket_of(task_id)
    await redis_client.execute("HSET", keys.definitions(p, b), task_id, b"\x94\xa5email")
    with pytest.raises(ResponseError, match=f"^task {task_id}: its definition record .* delete"):
        await store.update(task_id, payload={"n": 2})
    with pytest.raises(TaskConflict, match=task_id):
        await store.create(TaskSpec("email", EVERY_MINUTE, task_id=task_id))
    assert await store.delete(task_id)
    assert await redis_client.execute("HEXISTS", keys.states(p, b), task_id) == 0
    assert await redis_client.execute("ZSCORE", keys.schedule(p), task_id) is None
    assert (await store.create(TaskSpec("email", EVERY_MINUTE, task_id=task_id))).created


async def test_an_index_entry_such_a_delete_leaves_names_no_task_of_another_type(
    store: TaskStore, redis_client: RedisClient
) -> None:
    """A task deleted while its definition could not be read keeps an entry in its type's
    index (the type was in that record); its id created again as another type is listed
    once, under its own type, and a clear of the first type leaves it and takes the stale
    entry."""
    await store.create(TaskSpec("email", EVERY_MINUTE, task_id="reused"))
    keys = await store.keys()
    p, b = keys.partition_of("reused"), keys.bucket_of("reused")
    await redis_client.execute("HSET", keys.definitions(p, b), "reused", b"\xc1")
    assert await store.delete("reused")
    await store.create(TaskSpec("sms", EVERY_MINUTE, task_id="reused"))
    listed, _ = await store.list_tasks()
    assert [(t.task_id, t.type) for t in listed] == [("reused", "sms")]
    assert await store.clear_type("email") == 0
    assert await redis_client.execute("HEXISTS", keys.by_type(p, "email", b), "reused") == 0
    task = await store.get("reused")
    assert task is not None and task.type == "sms"


async def test_a_state_left_without_its_definition_is_deleted(
    store: TaskStore, redis_client: RedisClient
) -> None:
    """A partial delete or restore left a task's state and schedule entry but not its
    definition: the poller names it (``test_poller``), and the delete it points to takes
    what is left (it found no definition and said there was no such task); a create
    under its id before that is a conflict (the new task would inherit what is left)."""
    task_id = (await store.create(TaskSpec("email", EVERY_MINUTE))).task_id
    keys = await store.keys()
    p, b = keys.partition_of(task_id), keys.bucket_of(task_id)
    await redis_client.execute("HDEL", keys.definitions(p, b), task_id)
    with pytest.raises(TaskConflict, match=task_id):  # it would inherit what is left
        await store.create(TaskSpec("email", EVERY_MINUTE, task_id=task_id))
    assert await store.delete(task_id)
    assert await redis_client.execute("HEXISTS", keys.states(p, b), task_id) == 0
    assert await redis_client.execute("ZSCORE", keys.schedule(p), task_id) is None
    assert not await store.delete(task_id)


async def test_clear_type_deletes_in_bounded_batches(store: TaskStore) -> None:
    await store.create_many([TaskSpec("bulk", EVERY_MINUTE, i) for i in range(1300)])
    keep = await store.create(TaskSpec("other", EVERY_MINUTE))
    assert await store.clear_type("bulk") == 1300
    page, _ = await store.list_tasks(task_type="bulk")
    assert page == []
    assert await store.get(keep.task_id) is not None


async def test_concurrent_updates_keep_the_index_consistent(store: TaskStore) -> None:
    """Invariant under any interleaving: the task is in the schedule iff it is active."""
    task_id = (await store.create(TaskSpec("email", EVERY_MINUTE, 0))).task_id

    async def writer(n: int) -> None:
        for i in range(15):
            action = (n + i) % 3
            if action == 0:
                await store.pause(task_id)
            elif action == 1:
                await store.resume(task_id)
            else:
                await store.update(task_id, payload={"writer": n, "i": i})

    async with trio.open_nursery() as nursery:
        for n in range(6):
            nursery.start_soon(writer, n)
    task = await store.get(task_id)
    assert task is not None
    scheduled = await in_schedule(store, task_id) is not None
    assert scheduled == (task.status == "active")
    assert isinstance(task.payload, dict) and set(task.payload) == {"writer", "i"}


@pytest.mark.parametrize(
    ("layout", "hint"),
    [
        (0, "use a Metronome that reads it"),
        (1, "run `metronome migrate` \\(with every node stopped\\)"),
        (2, "run `metronome migrate` \\(with every node stopped\\)"),
        (4, "use a Metronome that reads it"),
    ],
)
async def test_namespace_of_another_layout_is_refused_with_the_way_out(
    redis_client: RedisClient, namespace: str, layout: int, hint: str
) -> None:
    await redis_client.execute("HSET", f"{namespace}:meta", "partitions", 8, "layout", layout)
    with pytest.raises(LayoutMismatch, match=f"has layout {layout}; .* reads layout 3: {hint}"):
        await TaskStore(redis_client, namespace).keys()


@pytest.mark.parametrize(
    ("field", "value"),
    [("layout", "three"), ("partitions", "16 "), ("partitions", "0"), ("buckets", "1e3"),
     ("buckets", "99999999")],
)  # fmt: skip
async def test_a_meta_field_mended_wrong_by_hand_is_refused_naming_it(
    redis_client: RedisClient, namespace: str, field: str, value: str
) -> None:
    """The meta key's numbers, typed by hand (the layout refusal says how): one that is
    no whole number in range is a LayoutMismatch naming it, not a ValueError at every
    call of every node."""
    meta = f"{namespace}:meta"
    await redis_client.execute("HSET", meta, "layout", 3, "partitions", 8, "buckets", 64)
    await redis_client.execute("HSET", meta, field, value)
    with pytest.raises(LayoutMismatch, match=f"has {field} = '{value}', not a whole number"):
        await TaskStore(redis_client, namespace).keys()


async def test_a_namespace_whose_meta_key_is_lost_is_refused_not_laid_out_again(
    redis_client: RedisClient, namespace: str
) -> None:
    first = TaskStore(redis_client, namespace, default_partitions=4, default_buckets=16)
    created = await first.create(TaskSpec("email", EVERY_MINUTE, {"n": 1}))
    task = await first.get(created.task_id)
    assert task is not None
    await redis_client.execute("DEL", f"{namespace}:meta")
    other = TaskStore(redis_client, namespace, default_partitions=64)
    with pytest.raises(LayoutMismatch, match=f"holds data \\({namespace}:types\\) but has no"):
        await other.keys()
    assert await redis_client.execute("EXISTS", f"{namespace}:meta") == 0
    await redis_client.execute(
        "HSET", f"{namespace}:meta", "layout", 3, "partitions", 4, "buckets", 16, "messages", 2
    )
    restored = TaskStore(redis_client, namespace, default_partitions=64)
    assert await restored.get(created.task_id) == task


async def test_partition_count_is_fixed_by_the_first_user(
    redis_client: RedisClient, namespace: str
) -> None:
    first = await TaskStore(redis_client, namespace, default_partitions=4).keys()
    second = await TaskStore(redis_client, namespace, default_partitions=64).keys()
    assert first == second == Keys(namespace, 4, compact_messages=True)


async def test_a_foreign_record_is_reported_not_crashed_on(store: TaskStore) -> None:
    keys = await store.keys()
    p, b = keys.partition_of("legacy"), keys.bucket_of("legacy")
    await store.client.execute("HSET", keys.definitions(p, b), "legacy", "interval_sec=60")
    await store.client.execute("HSET", keys.states(p, b), "legacy", "active")
    with pytest.raises(ValueError, match="'legacy': its definition record is not one Metronome"):
        await store.get("legacy")


async def test_jitter_delays_the_fire_but_not_the_grid(store: TaskStore) -> None:
    start = await store.now_ms() + 60_000
    schedule = Schedule("interval", every_s=60, start_ms=start, jitter_s=5)
    ids = [c.task_id for c in await store.create_many([TaskSpec("j", schedule) for _ in range(40)])]
    scores = [await in_schedule(store, i) for i in ids]
    assert all(s is not None and start <= s <= start + 5000 for s in scores)
    assert len(set(scores)) > 1  # spread, not one value
    for task_id in ids:
        task = await store.get(task_id)
        assert task is not None and task.next_run_ms == start  # the grid is untouched


async def test_store_operations_write_lifecycle_lines(
    store: TaskStore, log_lines: Callable[[], list[dict[str, Any]]]
) -> None:
    task_id = (await store.create(TaskSpec("email", EVERY_MINUTE))).task_id
    await store.update(task_id, payload=2)
    await store.pause(task_id)
    await store.resume(task_id)
    await store.stop(task_id)
    with pytest.raises(InvalidTransition, match="stopped"):  # stopping is for good
        await store.trigger(task_id)
    await store.delete(task_id)
    await store.create(TaskSpec("to-clear", EVERY_MINUTE))
    assert await store.clear_type("to-clear") == 1
    events = [(e["event"], e.get("task_id") or e.get("type"))
              for e in log_lines() if e["actor"] == "store"]  # fmt: skip
    assert events == [
        ("created", task_id), ("updated", task_id), ("paused", task_id),
        ("resumed", task_id),
        ("not_run", task_id),  # its first grid time, due at its creation: the pause skipped it
        ("stopped", task_id), ("deleted", task_id),
        ("created", ANY), ("cleared", "to-clear"),
    ]  # fmt: skip


@pytest.mark.parametrize("by_action", [False, True])
async def test_a_resume_says_how_many_grid_times_the_pause_skipped(
    store: TaskStore, redis_client: RedisClient, log_lines: Callable[[], list[dict[str, Any]]],
    by_action: bool,
) -> None:  # fmt: skip
    """Every grid time runs or is not run for a named reason: those that passed while the
    task was paused are skipped by its resume (it goes on from the next grid time), and
    the resume says so: one ``not_run`` line (reason ``paused``) with their count and the
    last of them, and the task's not-run record, which explain reads. A resume with
    nothing skipped says nothing more."""
    from actors.store.actions import ActionSpec, create_action
    from actors.store.apply_actions import ActionSettings, apply_action

    start = await store.now_ms() - 10_500
    every_second = Schedule("interval", every_s=1, start_ms=start)
    task_id = (await store.create(TaskSpec("t", every_second, task_id="p"))).task_id
    later = Schedule("interval", every_s=60, start_ms=start + 70_000)  # none passed
    quiet = (await store.create(TaskSpec("t", later, task_id="q"))).task_id
    for t in (task_id, quiet):
        await store.pause(t)
    if by_action:
        spec = ActionSpec.from_dict({"action": "resume", "selector": {"type": "t"}})
        await create_action(store, "r1", spec, None, "me", 60_000)
        await apply_action(store, "r1", "me", ActionSettings())
    else:
        for t in (task_id, quiet):
            await store.resume(t)
    lines = [e for e in log_lines() if e["event"] == "not_run"]
    assert len(lines) == 1, lines
    (line,) = lines
    last = line["due_ms"]
    assert (line["task_id"], line["reason"], line["type"]) == (task_id, "paused", "t")
    assert (last - start) % 1000 == 0 and line["count"] == (last - start) // 1000 + 1 >= 11
    assert line["schedule_id"] == f"{task_id}:{last}"
    task = await store.get(task_id)
    assert task is not None and task.next_run_ms == last + 1000  # goes on from the next one
    keys = await store.keys()
    record = await redis_client.execute("HGET", keys.not_run(keys.partition_of(task_id)), task_id)
    assert record.decode() == f"{line['count']} paused {last} -"


async def test_a_resume_counts_no_grid_time_the_tasks_flight_decided_as_skipped(
    store: TaskStore, log_lines: Callable[[], list[dict[str, Any]]]
) -> None:
    """A task with an overlap policy whose next time was decided already (in flight,
    waiting: a claim whose commit the pause came before, a task parked on it) runs that
    time; its resume counts only the grid times after it as skipped by the pause."""
    from actors.store.flights import Planned

    start = await store.now_ms() - 10_500
    grid = Schedule("interval", every_s=1, start_ms=start, overlap="buffer_all")
    task_id = (await store.create(TaskSpec("t", grid, task_id="f"))).task_id
    scripts = await store.scripts()
    keys = await store.keys()
    decided = await scripts.decide_overlaps("claim", {keys.partition_of(task_id): [
        Planned(task_id, "B", [start])]})  # fmt: skip
    assert decided[task_id].run == [(start, True)]  # in flight: it runs
    await store.pause(task_id)
    await store.resume(task_id)
    (line,) = [e for e in log_lines() if e["event"] == "not_run"]
    assert line["count"] == (line["due_ms"] - start) // 1000  # not the one in flight
