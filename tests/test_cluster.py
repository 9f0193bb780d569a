"""The same store, poller and consumers against a real Redis Cluster (three local primaries):
every script's keys share a slot, pipelines split by shard, scripts load on every primary."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import attrs
import pytest

from actors.api.explain import explain
from actors.api.queues import Queues
from actors.app import _Roles
from actors.config import Config, ConsumerSection
from actors.domain.model import TaskSpec
from actors.domain.schedules import Schedule
from actors.scheduling.poller import Poller, PollerSettings
from actors.store.messages import Message
from actors.store.tasks import TaskStore
from runtime.config import RedisSection
from runtime.logging import get_logger
from runtime.redis_io import RedisClient
from tests.execution_harness import node_config, records, running_node, wait_until


@pytest.fixture
async def cluster_client(cluster_url: str) -> AsyncIterator[RedisClient]:
    client = RedisClient.from_settings(cluster_url, RedisSection(url=cluster_url, cluster=True))
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
def store(cluster_client: RedisClient, namespace: str) -> TaskStore:
    return TaskStore(cluster_client, namespace, default_partitions=8)


async def test_partitions_really_spread_over_the_shards(store: TaskStore) -> None:
    keys = await store.keys()
    raw = store.client.raw
    owners = {raw.get_node_from_key(keys.schedule(p)).port for p in range(keys.partitions)}
    assert len(owners) >= 2  # the test would prove nothing on one shard


async def test_a_node_creates_its_namespace_on_a_cluster_with_64_partitions(
    cluster_url: str, namespace: str
) -> None:
    """Unless ``[scheduler] partitions`` is set: with 16 the busiest of three masters would
    hold ~1.3x its share."""
    config = Config(redis=RedisSection(url=cluster_url, cluster=True), namespace=namespace)
    store = _Roles(config, cluster_url).store
    try:
        assert (await store.keys()).partitions == 64
    finally:
        await store.client.aclose()


async def test_store_operations_on_a_cluster(store: TaskStore) -> None:
    created = await store.create_many(
        [TaskSpec("w", Schedule("interval", every_s=60), i) for i in range(300)]
    )
    first = created[0].task_id
    assert await store.pause(first) == "paused"
    assert await store.resume(first) == "active"
    await store.update(created[1].task_id, payload={"v": 2})
    task = await store.get(created[1].task_id)
    assert task is not None and task.payload == {"v": 2}
    page, cursor = await store.list_tasks(task_type="w", limit=1000)
    assert cursor is None and len(page) == 300
    assert await store.clear_type("w") == 300


async def test_competing_pollers_on_a_cluster_enqueue_each_fire_once(store: TaskStore) -> None:
    now = await store.now_ms()
    start = now - 5_500
    schedule = Schedule("interval", every_s=1, start_ms=start, misfire="fire_all")
    ids = [c.task_id for c in await store.create_many([TaskSpec("c", schedule) for _ in range(40)])]
    keys = await store.keys()
    pollers = [Poller(store, PollerSettings(batch_size=7)) for _ in range(3)]
    for _ in range(12):
        for poller in pollers:
            await poller.tick(await store.scripts(), poller.partitions(keys), get_logger())
    entries = await store.client.execute("XRANGE", keys.queue("c"), "-", "+")
    fires = Counter(Message.decode(i, fields, "c").schedule_id for i, fields in entries)
    assert set(fires.values()) == {1}
    assert {f"{t}:{start + k * 1000}" for t in ids for k in range(6)} <= set(fires)


async def test_execution_on_a_cluster_runs_retries_and_dead_letters(
    store: TaskStore, cluster_url: str, namespace: str, tmp_path: Path, record: Path
) -> None:
    config = node_config(
        cluster_url, namespace, tmp_path,
        {
            "ok": ConsumerSection(handler="tests.handlers.jobs:noop"),
            "bad": ConsumerSection(
                handler="tests.handlers.jobs:failing", max_attempts=2, backoff_base_s=0.05
            ),
        },
    )  # fmt: skip
    config = attrs.evolve(config, redis=RedisSection(url=cluster_url, cluster=True))
    await store.create_many([TaskSpec("ok", Schedule("once", at_ms=0)) for _ in range(30)])
    await store.create(TaskSpec("bad", Schedule("once", at_ms=0), task_id="b"))
    keys = await store.keys()

    async def done() -> bool:
        dlq = int(await store.client.execute("XLEN", keys.dlq("bad")))
        return dlq == 1 and sum(r["event"] == "ran" for r in records(record)) == 30

    async with running_node(config):
        await wait_until(done, timeout_s=20)
    assert [r["attempt"] for r in records(record) if r["task_id"] == "b"] == [0, 1]
    (ok,) = (await Queues(store).stats(["ok"]))["queues"]
    assert (ok["length"], ok["pending"], ok["undelivered"]) == (0, 0, 0)  # all acknowledged


async def test_inspection_and_dead_letter_operations_on_a_cluster(store: TaskStore) -> None:
    """What the API's explain, queues and DLQ endpoints run, on a real cluster (pipelines
    there cannot be transactions and split by shard)."""
    keys = await store.keys()
    await store.create(TaskSpec("w", Schedule("interval", every_s=3600), task_id="x"))
    schedule_id, _ = await store.trigger("x")
    # A dead letter as a consumer would write it (dead_letter.lua is tested elsewhere).
    dead_id = await store.client.execute(
        "XADD", keys.dlq("w"), "*", "task_id", "x", "schedule_id", schedule_id, "type", "w",
        "payload", "null", "attempt", "2", "due_ms", "1", "reason", "failed", "error", "boom",
    )  # fmt: skip
    queues = Queues(store)
    (stats,) = (await queues.stats(["w"]))["queues"]
    assert (stats["length"], stats["dead_letters"]) == (1, 1)
    facts = await explain(store, "x")
    assert [m["schedule_id"] for m in facts["stream"]] == [schedule_id]
    assert facts["dead_letters"]["count"] == 1
    page, cursor = await queues.dead_letters("w")
    assert [d.entry_id for d in page] == [dead_id.decode()] and cursor is None
    assert (await queues.replay("w", [dead_id.decode()]))[dead_id.decode()] not in (
        "missing", "malformed",
    )  # fmt: skip
    assert await store.client.execute("XLEN", keys.queue("w")) == 2
    assert await queues.purge("w") == 0


async def test_a_backfill_on_a_cluster_appends_each_fire_once(store: TaskStore) -> None:
    now = await store.now_ms()
    start = now - now % 60_000 - 10 * 60_000
    for i in range(4):  # types on different slots
        spec = TaskSpec(f"fill{i}", Schedule("interval", every_s=60, start_ms=start), None, f"b{i}")
        await store.create(spec)
        await store.pause(f"b{i}")  # no poller here: active, its overdue grid is the poller's
    first = await store.backfill_type("fill2", start, start + 5 * 60_000)
    assert [(b.task_id, b.enqueued) for b in first] == [("b2", 5)]
    again = await store.backfill("b2", start, start + 6 * 60_000)
    assert (again.enqueued, again.already) == (1, 5)
    keys = await store.keys()
    assert await store.client.execute("XLEN", keys.queue("fill2")) == 6
