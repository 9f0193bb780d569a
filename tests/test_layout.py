"""Layout version 3: a task as compact records in bucket hashes (actors/store/records.py),
the Lua and Python halves agreeing on them, and the migrations from layouts 1 and 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import attrs
import msgpack
import pytest
import redis
from hypothesis import given, settings
from hypothesis import strategies as st
from structlog import get_logger

from actors.config import ConsumerSection
from actors.domain.errors import LayoutMismatch
from actors.domain.model import TaskSpec
from actors.domain.schedules import Schedule
from actors.scheduling.poller import Poller, PollerSettings
from actors.store.keys import LAYOUT_VERSION, Keys, bucket_hash
from actors.store.lua import records_prelude
from actors.store.migrate import migrate
from actors.store.records import (
    OUTCOME_NAMES,
    claim_of,
    decode_schedule,
    encode_definition,
    encode_schedule,
    encode_state,
)
from actors.store.replies import OutcomeWrite
from actors.store.tasks import TaskStore
from runtime.redis_io import RedisClient, Script
from tests.execution_harness import node_config, running_node, wait_until

BUCKET_OF = Script(
    "bucket_of_test",
    records_prelude()
    + "local out = {} for i = 2, #ARGV do out[#out + 1] = bucket_of(ARGV[i], tonumber(ARGV[1]))"
    " end return out",
)


@given(st.lists(st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}", fullmatch=True), min_size=1,
                max_size=50),
       st.sampled_from([1, 7, 1024, 65536]))  # fmt: skip
@settings(max_examples=30, deadline=None)
def test_lua_and_python_pick_the_same_bucket(redis_url: str, ids: list[str], buckets: int) -> None:
    db = redis.Redis.from_url(redis_url)
    try:
        got = db.eval(BUCKET_OF.source, 0, buckets, *ids)
    finally:
        db.close()
    assert got == [bucket_hash(i) % buckets for i in ids]


@pytest.mark.parametrize(
    "schedule",
    [
        Schedule("interval", every_s=60),
        Schedule("interval", every_s=0.25, start_ms=1_796_025_522_080, end_ms=1_896_025_522_080),
        Schedule("cron", cron="*/5 9-17 * * 1-5", tz="Europe/Paris", jitter_s=2.5, max_runs=9),
        Schedule("once", at_ms=1_796_025_522_080, misfire="fire_all", misfire_cap=7),
        Schedule("interval", every_s=3600, misfire="skip"),
    ],
)
def test_a_stored_schedule_reads_back_equal(schedule: Schedule) -> None:
    assert decode_schedule(encode_schedule(schedule)) == schedule


def test_a_stored_schedule_is_a_few_bytes() -> None:
    assert len(encode_schedule(Schedule("interval", every_s=60))) <= 5


def test_a_stored_schedule_of_another_format_is_named() -> None:
    with pytest.raises(ValueError, match="is not one Metronome wrote"):
        decode_schedule(b'{"kind":"interval","every_s":60}')


async def test_records_stay_compact_through_a_tasks_life(
    redis_client: RedisClient, namespace: str
) -> None:
    """What makes a task cheap: its buckets keep Redis's listpack encoding (records under
    64 bytes) after creation, claim, commit and a failed and a good run."""
    store = TaskStore(redis_client, namespace, default_partitions=1, default_buckets=2)
    now = await store.now_ms()
    schedule = Schedule("interval", every_s=60, start_ms=now - 1000)
    ids = [c.task_id for c in await store.create_many(
        [TaskSpec("email", schedule, {"to": f"user{i}@example.com"}) for i in range(100)]
    )]  # fmt: skip
    keys = await store.keys()
    poller = Poller(store, PollerSettings())
    scripts = await store.scripts()
    assert (await poller.tick(scripts, [0], get_logger())).enqueued == 100
    outcomes = [
        OutcomeWrite(task_id, n % 2, now + 1_000_000 + n, "boom" * 50)
        for n, task_id in enumerate(ids)
    ]
    await scripts.record_outcomes(outcomes)
    # then every one succeeds
    await scripts.record_outcomes([attrs.evolve(o, outcome=0) for o in outcomes])
    for b in range(2):
        for key in (
            keys.definitions(0, b), keys.states(0, b), keys.runs(0, b), keys.by_type(0, "email", b)
        ):  # fmt: skip
            assert await store.client.execute("OBJECT", "ENCODING", key) == b"listpack", key
    task = await store.get(ids[1])
    assert task is not None
    assert (task.fires, task.runs, task.retries, task.last_status, task.last_error) == (
        1, 1, 0, "ok", None,
    )  # fmt: skip
    assert task.next_run_ms == now - 1000 + 60_000


# -- migration from layout 1 ----------------------------------------------------------------


def write_layout_1(db: Any, namespace: str, partitions: int = 2) -> Keys:
    """A namespace as Metronome wrote it before layout 2 (a hash per task), by hand."""
    keys = Keys(namespace, partitions)
    db.hset(f"{namespace}:meta", mapping={"partitions": partitions, "layout": 1})
    db.sadd(keys.types, "email", "report")
    tasks = {
        "t-active": {"type": "email", "payload": '{"to":"a@example.com"}',
                     "sched": '{"every_s":60.0,"kind":"interval"}', "status": "active",
                     "created_ms": 1000, "next_ms": 61_000, "fires": 3, "runs": 2,
                     "last_run_ms": 5000, "last_status": "ok", "claim": "poller-x"},
        "t-failing": {"type": "email", "payload": "null",
                      "sched": '{"cron":"0 9 * * *","kind":"cron","tz":"Europe/Paris"}',
                      "status": "paused", "created_ms": 2000, "updated_ms": 3000,
                      "next_ms": 90_000, "retries": 4, "last_status": "retry",
                      "last_run_ms": 7000, "last_error": "timeout talking to smtp"},
        "t-done": {"type": "report", "payload": "[1,2]", "sched": '{"at_ms":5,"kind":"once"}',
                   "status": "finished", "created_ms": 4000, "fires": 1},
    }  # fmt: skip
    for task_id, fields in tasks.items():
        tag = keys.tag(keys.partition_of(task_id))
        db.hset(f"{tag}:task:{task_id}", mapping=fields)
        db.sadd(f"{tag}:type:{fields['type']}", task_id)
        if "next_ms" in fields and fields["status"] == "active":
            db.zadd(keys.schedule(keys.partition_of(task_id)), {task_id: fields["next_ms"]})
    return keys


async def test_migration_moves_every_task_and_loses_nothing(
    db: Any, redis_client: RedisClient, namespace: str
) -> None:
    keys = Keys(namespace, 2, 8)
    write_layout_1(db, namespace)
    with pytest.raises(LayoutMismatch, match="metronome migrate"):
        await TaskStore(redis_client, namespace).keys()
    assert await migrate(redis_client, namespace, buckets=8, batch=2) == 3
    assert db.hget(f"{namespace}:meta", "layout") == str(LAYOUT_VERSION).encode()
    store = TaskStore(redis_client, namespace)
    assert (await store.keys()).buckets == 8
    active, failing, done = await store.get_many(["t-active", "t-failing", "t-done"])
    assert active is not None and failing is not None and done is not None
    assert (active.type, active.payload, active.schedule, active.status) == (
        "email", {"to": "a@example.com"}, Schedule("interval", every_s=60), "active",
    )  # fmt: skip
    assert (active.next_run_ms, active.fires, active.runs, active.last_status) == (
        61_000, 3, 2, "ok",
    )  # fmt: skip
    assert (failing.status, failing.updated_ms, failing.retries, failing.last_error) == (
        "paused", 3000, 4, "timeout talking to smtp",
    )  # fmt: skip
    assert failing.schedule == Schedule("cron", cron="0 9 * * *", tz="Europe/Paris")
    assert (done.status, done.next_run_ms, done.payload) == ("finished", None, [1, 2])
    p = keys.partition_of("t-active")
    state = db.hget(keys.states(p, keys.bucket_of("t-active")), "t-active")
    assert claim_of(state) == "poller-x"
    assert db.zscore(keys.schedule(p), "t-active") == 61_000  # the schedule is untouched
    # counted as a write: a poller that knew the partition's states reads them again
    assert int(db.hget(keys.partition_owner(p), "writes")) >= 1
    assert not db.keys(f"*{namespace}*:task:*") and not db.keys(f"*{namespace}*:type:email")
    listed, _ = await store.list_tasks(task_type="email")
    assert {t.task_id for t in listed} == {"t-active", "t-failing"}
    assert await migrate(redis_client, namespace) == 0  # already current
    # the scripts read what the migration wrote (they cannot read MessagePack bin)
    assert await store.update("t-failing", payload={"v": 2}) == "paused"


async def test_a_task_migration_cannot_read_stops_it_with_the_key_named(
    db: Any, redis_client: RedisClient, namespace: str
) -> None:
    keys = write_layout_1(db, namespace, partitions=1)
    db.hset(f"{keys.tag(0)}:task:t-done", "sched", "every minute")
    with pytest.raises(LayoutMismatch, match=r"task:t-done: not a task Metronome 1 wrote"):
        await migrate(redis_client, namespace)
    assert db.hget(f"{namespace}:meta", "layout") == b"1"  # nodes still refuse it
    assert db.hget(f"{keys.tag(0)}:task:t-done", "type") == b"report"  # nothing lost
    db.hset(f"{keys.tag(0)}:task:t-done", "sched", '{"at_ms":5,"kind":"once"}')
    assert await migrate(redis_client, namespace) == 1  # resumes: the others had moved
    assert (await TaskStore(redis_client, namespace).get("t-done")) is not None


async def test_a_migration_waits_for_the_namespaces_nodes_to_stop(
    db: Any, redis_client: RedisClient, namespace: str
) -> None:
    """A node of the older version still running writes to the records being moved (what
    it writes to a task's old hash after the move is lost): while one reports in, the
    migration refuses, naming it, and changes nothing; a report older than a stopped
    node's last leaves it free, and ``force`` migrates anyway."""
    keys = write_layout_1(db, namespace)
    now = await redis_client.clock_ms()
    report = {"process": "old-node", "seen_ms": now - 2000}
    db.hset(keys.nodes, mapping={"old-node": json.dumps(report), "junk": "not json"})
    with pytest.raises(LayoutMismatch, match=r"nodes still running \(old-node reported in"):
        await migrate(redis_client, namespace)
    assert db.hget(f"{namespace}:meta", "layout") == b"1"
    assert db.exists(f"{keys.tag(keys.partition_of('t-active'))}:task:t-active")
    db.hset(keys.nodes, "old-node", json.dumps({**report, "seen_ms": now - 60_000}))
    assert await migrate(redis_client, namespace, batch=2) == 3


async def test_a_migration_can_be_forced_past_reports_of_nodes_known_stopped(
    db: Any, redis_client: RedisClient, namespace: str
) -> None:
    keys = write_layout_1(db, namespace)
    report = {"process": "old-node", "seen_ms": await redis_client.clock_ms()}
    db.hset(keys.nodes, "old-node", json.dumps(report))
    assert await migrate(redis_client, namespace, force=True) == 3
    assert db.hget(f"{namespace}:meta", "layout") == str(LAYOUT_VERSION).encode()


def test_the_cli_migrates_a_namespace(db: Any, redis_url: str, namespace: str) -> None:
    write_layout_1(db, namespace)
    command = [sys.executable, "-m", "actors.admin.cli", "migrate", "--redis", redis_url]
    done = subprocess.run([*command, "--namespace", namespace], capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"{namespace}: 3 tasks migrated" in done.stdout
    missing = subprocess.run([*command, "--namespace", namespace + "-none"], capture_output=True,
                             text=True, timeout=60)  # fmt: skip
    assert missing.returncode == 1 and "does not exist" in missing.stderr
    down = subprocess.run([*command[:-1], "redis://127.0.0.1:1"], capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert down.returncode == 7 and "Connection refused" in down.stderr  # one line, no traceback
    assert "Traceback" not in down.stderr
    bad = subprocess.run([*command[:-1], "redis://127.0.0.1:1/abc"], capture_output=True,
                         text=True, timeout=60)  # fmt: skip
    assert bad.returncode == 2 and "--redis: " in bad.stderr and "database number" in bad.stderr
    assert json.loads(db.hget(f"{namespace}:meta", "layout")) == LAYOUT_VERSION


# -- migration from layout 2 ----------------------------------------------------------------


async def test_a_layout_2_namespace_moves_by_its_number_and_keeps_its_run_counts(
    db: Any, redis_client: RedisClient, namespace: str
) -> None:
    """Layout 3 reads layout 2's records as they are: the migration only changes the number
    (nodes refuse the namespace until then), and a task's first outcome since carries the
    counts its state record held on into its run record, leaving the state as it was."""
    keys = Keys(namespace, 1, 2)
    db.hset(f"{namespace}:meta", mapping={"partitions": 1, "buckets": 2, "layout": 2})
    db.sadd(keys.types, "email")
    b = keys.bucket_of("old")
    sched = encode_schedule(Schedule("interval", every_s=60))
    # as the 1 -> 2 migration of Metronome 0.1 wrote it: the schedule a MessagePack bin,
    # which the scripts cannot read
    old_definition = b"".join(
        msgpack.packb(v) for v in ("email", "null", sched, 1000)
    )  # fmt: skip
    db.hset(keys.definitions(0, b), "old", old_definition)
    b_ok = keys.bucket_of("new")
    db.hset(keys.definitions(0, b_ok), "new", encode_definition("email", "1", sched, 2000))
    db.hset(keys.states(0, b_ok), "new", encode_state("paused", 61_000, 0, None, 0, 0, None, None))
    db.hset(keys.by_type(0, "email", b_ok), "new", "")
    state = encode_state("active", 61_000, 7, None, 5, 2, 9000, "retry")
    db.hset(keys.states(0, b), "old", state)
    db.hset(keys.by_type(0, "email", b), "old", "")
    db.hset(keys.errors(0), "old", "smtp timed out")
    db.zadd(keys.schedule(0), {"old": 61_000})
    with pytest.raises(LayoutMismatch, match=r"has layout 2; .* `metronome migrate`"):
        await TaskStore(redis_client, namespace).keys()
    assert await migrate(redis_client, namespace) == 1  # the one the scripts cannot read
    assert db.hget(f"{namespace}:meta", "layout") == str(LAYOUT_VERSION).encode()
    store = TaskStore(redis_client, namespace)
    task = await store.get("old")
    assert task is not None
    assert (task.fires, task.runs, task.retries, task.last_run_ms, task.last_status) == (
        7, 5, 2, 9000, "retry",
    )  # fmt: skip
    assert task.last_error == "smtp timed out"
    scripts = await store.scripts()
    assert await scripts.record_outcomes([OutcomeWrite("old", OUTCOME_NAMES.index("ok"), 9500, "")])
    task = await store.get("old")
    assert task is not None
    assert (task.runs, task.retries, task.last_run_ms, task.last_status, task.last_error) == (
        6, 0, 9500, "ok", None,
    )  # fmt: skip
    assert db.hget(keys.states(0, b), "old") == state  # outcomes never write the state
    assert db.hexists(keys.runs(0, b), "old")
    assert await store.update("old", payload={"v": 2}) == "active"  # the scripts read it
    assert await store.delete("old")
    assert not db.hexists(keys.runs(0, b), "old")  # deleted with the task


# -- the meta key lost -----------------------------------------------------------------------


async def test_a_running_node_lays_a_lost_meta_key_down_again(
    redis_client: RedisClient, redis_url: str, namespace: str, tmp_path: Path
) -> None:
    """The meta key is gone (Redis back empty, a hand delete) while a node runs: the node
    knows the namespace's counts and writes them back within its presence beat, so a node
    started then reads the namespace as it was (not its own defaults, which would move
    every task), rather than being refused."""
    store = TaskStore(redis_client, namespace, default_partitions=4, default_buckets=16)
    await store.create(TaskSpec("work", Schedule("interval", every_s=3600)))
    consumers = {"work": ConsumerSection("tests.handlers.jobs:sleepy", concurrency=1)}
    async with running_node(node_config(redis_url, namespace, tmp_path, consumers)):
        meta = f"{namespace}:meta"
        await wait_until(lambda: _exists(redis_client, f"{namespace}:pollers"))
        await redis_client.execute("DEL", meta)
        await wait_until(lambda: _exists(redis_client, meta), timeout_s=30)
    later = TaskStore(redis_client, namespace, default_partitions=64)
    assert await later.keys() == Keys(namespace, 4, 16, compact_messages=True)


async def _exists(client: RedisClient, key: str) -> bool:
    return bool(await client.execute("EXISTS", key))
