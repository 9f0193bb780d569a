"""Execution against a real Redis: lifecycle, retries, DLQ, dedupe, leases, isolation."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import pytest
import trio

from actors.api.queues import Queues
from actors.config import ConsumerSection
from actors.domain.model import TaskSpec
from actors.domain.schedules import Schedule
from actors.execution.completion import RetryPolicy
from actors.execution.handlers import resolve
from actors.store.keys import GROUP
from actors.store.ledger import task_history
from actors.store.messages import Message
from actors.store.tasks import TaskStore
from runtime.errors import ConfigError, RuntimeStartError
from runtime.redis_io import RedisClient
from tests.execution_harness import (
    node_config,
    one_message_queued,
    records,
    running_node,
    stream_entries,
    wait_records,
    wait_until,
)

LogLines = Callable[[], list[dict[str, Any]]]


@pytest.fixture
async def store(redis_client: RedisClient, namespace: str) -> TaskStore:
    return TaskStore(redis_client, namespace, default_partitions=4)


def consumer(handler: str, **settings: Any) -> ConsumerSection:
    return ConsumerSection(handler=f"tests.handlers.jobs:{handler}", **settings)


async def test_lifecycle_of_one_task_reads_in_order(
    store: TaskStore, redis_url: str, namespace: str, tmp_path: Path, record: Path,
    log_lines: LogLines,
) -> None:  # fmt: skip
    config = node_config(
        redis_url, namespace, tmp_path,
        {"beat": consumer("noop"), "tick": consumer("sync_noop")},
    )  # fmt: skip
    await store.create(TaskSpec("beat", Schedule("interval", every_s=0.3), task_id="b1"))
    await store.create(TaskSpec("tick", Schedule("interval", every_s=0.3), task_id="t1"))
    async with running_node(config):
        await wait_until(
            lambda: _async(len([r for r in records(record) if r["task_id"] == "t1"]) >= 2)
        )
    lines = log_lines()
    first = f"b1:{next(r['due_ms'] for r in records(record) if r['task_id'] == 'b1')}"
    story = [
        e["event"] for e in lines
        if e.get("task_id") == "b1" and (e["event"] == "created" or e.get("schedule_id") == first)
    ]  # fmt: skip
    # One info line per fire, written when it ends, with every time of its life in order:
    # Created (its own line) → Scheduled (due) → Queued → Running (started) → Finished.
    assert story == ["created", "finished"]
    done = next(e for e in lines if e["event"] == "finished" and e["schedule_id"] == first)
    assert done["due_ms"] <= done["queued_ms"] <= done["started_ms"] <= done["finished_ms"]
    assert done["start_lag_ms"] == done["started_ms"] - done["due_ms"]
    assert done["duration_ms"] == done["finished_ms"] - done["started_ms"]
    results = [r for r in _jsonl(tmp_path / "results-n1.jsonl") if r["task_id"] == "t1"]
    assert results[0]["result"] == "sync-ok"
    task = await store.get("b1")
    assert task is not None and task.runs >= 1 and task.last_status == "ok"


async def test_retries_back_off_then_succeed(
    store: TaskStore, redis_url: str, namespace: str, tmp_path: Path, record: Path,
    log_lines: LogLines,
) -> None:  # fmt: skip
    section = consumer("flaky", max_attempts=4, backoff_base_s=0.2, backoff_jitter=0)
    config = node_config(redis_url, namespace, tmp_path, {"flaky": section})
    await store.create(TaskSpec("flaky", Schedule("once", at_ms=0), {"succeed_on": 2}, task_id="f"))
    async with running_node(config):
        await wait_until(lambda: _async(any(r["event"] == "ran" for r in records(record))))
    runs = records(record)
    assert [(r["event"], r["attempt"]) for r in runs] == [
        ("failed", 0), ("failed", 1), ("ran", 2),
    ]  # fmt: skip
    assert {r["schedule_id"] for r in runs} == {"f:0"}  # one fire throughout
    gaps = [b["t_ms"] - a["t_ms"] for a, b in itertools.pairwise(runs)]
    assert 180 <= gaps[0] < 1000  # 0.2 s backoff (+ dispatcher tick)
    assert 380 <= gaps[1] < 1500  # 0.4 s
    retried = [e for e in log_lines() if e["event"] == "retried"]
    assert [(e["next_attempt"], e["delay_s"]) for e in retried] == [(1, 0.2), (2, 0.4)]
    assert "not yet" in retried[0]["error"]
    task = await store.get("f")
    assert task is not None and (task.runs, task.retries, task.last_status) == (1, 0, "ok")
    keys = await store.keys()
    assert await store.client.execute("ZCARD", keys.retry(keys.partition_of("f"))) == 0


async def test_dead_letter_after_max_attempts_has_full_context(
    store: TaskStore, redis_url: str, namespace: str, tmp_path: Path, record: Path
) -> None:
    section = consumer("failing", max_attempts=3, backoff_base_s=0.05)
    config = node_config(redis_url, namespace, tmp_path, {"bad": section})
    await store.create(TaskSpec("bad", Schedule("once", at_ms=0), {"n": 7}, task_id="d"))
    keys = await store.keys()
    async with running_node(config):
        await wait_until(lambda: _stream_len(store, keys.dlq("bad"), 1))
    (entry,) = await stream_entries(store, keys.dlq("bad"))
    assert entry["task_id"] == "d"
    assert entry["schedule_id"] == "d:0"
    assert entry["attempts"] == "3"
    assert entry["payload"] == '{"n":7}'
    assert entry["reason"] == "failed"
    assert entry["node"] == "n1"
    assert "RuntimeError: boom on attempt 2" in entry["error"]
    assert "Traceback" in entry["error"]
    assert [r["attempt"] for r in records(record)] == [0, 1, 2]
    assert await _queue_done(store, "bad")  # acknowledged: nothing pending, nothing unread
    task = await store.get("d")
    assert task is not None and (task.last_status, task.retries) == ("dead", 3)


async def test_unrecoverable_and_retry_later_are_honoured(
    store: TaskStore, redis_url: str, namespace: str, tmp_path: Path, record: Path
) -> None:
    config = node_config(
        redis_url, namespace, tmp_path,
        {
            "hopeless": consumer("hopeless", max_attempts=5),
            "later": consumer("asks_retry", max_attempts=2, backoff_base_s=100),
        },
    )  # fmt: skip
    await store.create(TaskSpec("hopeless", Schedule("once", at_ms=0), task_id="h"))
    await store.create(TaskSpec("later", Schedule("once", at_ms=0), task_id="l"))
    keys = await store.keys()
    async with running_node(config):
        await wait_until(lambda: _stream_len(store, keys.dlq("hopeless"), 1))
        await wait_until(lambda: _stream_len(store, keys.dlq("later"), 1))
    (hopeless,) = await stream_entries(store, keys.dlq("hopeless"))
    assert (hopeless["reason"], hopeless["attempts"]) == ("unrecoverable", "1")
    later = [r for r in records(record) if r["task_id"] == "l"]
    assert len(later) == 2
    assert later[1]["t_ms"] - later[0]["t_ms"] < 5000  # its own 0.2 s, not backoff's 100 s


async def test_handler_timeout_counts_as_a_failed_attempt(
    store: TaskStore, redis_url: str, namespace: str, tmp_path: Path, record: Path
) -> None:
    section = consumer("sleepy", timeout_s=0.3, max_attempts=1)
    config = node_config(redis_url, namespace, tmp_path, {"slow": section})
    await store.create(TaskSpec("slow", Schedule("once", at_ms=0), {"sleep_s": 30}, task_id="s"))
    keys = await store.keys()
    async with running_node(config):
        await wait_until(lambda: _stream_len(store, keys.dlq("slow"), 1))
    (entry,) = await stream_entries(store, keys.dlq("slow"))
    assert "timeout: handler ran longer than 0.3s" in entry["error"]
    assert [r["event"] for r in records(record)] == ["started"]


async def test_duplicate_fire_is_dropped_but_a_reclaimed_message_runs(
    store: TaskStore, redis_url: str, namespace: str, tmp_path: Path, record: Path,
    log_lines: LogLines,
) -> None:  # fmt: skip
    keys = await store.keys()
    stream = keys.queue("dup")
    fields = ["task_id", "x", "schedule_id", "x:5", "type", "dup", "payload", "null",
              "attempt", "0", "due_ms", "5", "enq_ms", "5"]  # fmt: skip
    await store.client.execute("XGROUP", "CREATE", stream, GROUP, "0", "MKSTREAM")
    # A message a consumer that then died had started: it is pending under "ghost", and
    # its fire is marked started under its own id.
    ghost_id = (await store.client.execute("XADD", stream, "*", *fields)).decode()
    await store.client.execute(
        "XREADGROUP", "GROUP", GROUP, "ghost", "COUNT", 1, "STREAMS", stream, ">"
    )
    ghost = Message.decode(
        ghost_id, dict(zip(*[iter(f.encode() for f in fields)] * 2, strict=True)), "dup"
    )
    assert await (await store.scripts()).begin_runs("dup", [ghost], 60_000) == [True]
    await _set_idle(store, stream, "ghost", ghost_id)
    # A second message of the same fire (a poller crashed after XADD, before commit).
    await store.client.execute("XADD", stream, "*", *fields)
    section = consumer("noop", dedupe_window_s=60)
    config = node_config(redis_url, namespace, tmp_path, {"dup": section}, pollers=0)
    async with running_node(config):
        await wait_until(lambda: _async(len(records(record)) >= 1))
        await wait_until(lambda: _queue_done(store, "dup"))
    assert len(records(record)) == 1  # the fire ran once: the reclaimed message
    events = log_lines()
    dropped = [e for e in events if e["event"] == "duplicate_dropped"]
    reclaimed = [e for e in events if e["event"] == "reclaimed"]
    assert len(dropped) == 1 and dropped[0]["msg_id"] != ghost_id
    assert [(e["msg_id"], e["from_consumer"]) for e in reclaimed] == [(ghost_id, "ghost")]
    finished = [e for e in events if e["event"] == "finished"]
    assert [e["msg_id"] for e in finished] == [ghost_id]


async def test_poison_message_goes_to_the_dlq(
    store: TaskStore, redis_url: str, namespace: str, tmp_path: Path, record: Path
) -> None:
    keys = await store.keys()
    later = Schedule("interval", every_s=3600, start_ms=await store.now_ms() + 3_600_000)
    await store.create(TaskSpec("p", later, task_id="x"))  # its history records the poison
    stream, msg = await one_message_queued(store, "p", "x")
    await store.client.execute("XREADGROUP", "GROUP", GROUP, "c1", "STREAMS", stream, ">")
    for owner in ("c2", "c3", "c4"):  # it keeps killing whoever takes it
        await store.client.execute("XCLAIM", stream, GROUP, owner, 0, msg)
    await _set_idle(store, stream, "c4", msg)
    section = consumer("noop", max_deliveries=4)
    config = node_config(redis_url, namespace, tmp_path, {"p": section}, pollers=0)
    async with running_node(config):
        await wait_until(lambda: _stream_len(store, keys.dlq("p"), 1))
        await wait_until(lambda: _dead_in_history(store, "x"))
    (entry,) = await stream_entries(store, keys.dlq("p"))
    assert (entry["reason"], entry["deliveries"], entry["task_id"]) == ("poison", "4", "x")
    (occurrence,) = await task_history(store, "x")
    assert occurrence.error is not None and occurrence.error.startswith("poison")
    assert abs(int(entry["dead_ms"]) - await store.now_ms()) < 60_000  # Redis's clock
    assert records(record) == []
    assert await store.client.execute("XLEN", stream) == 0


async def test_an_entry_with_more_fields_than_a_script_passes_on_is_dead_lettered_folded(
    store: TaskStore, redis_url: str, namespace: str, tmp_path: Path, record: Path
) -> None:
    """Another program's entry of 5,000 fields: its dead letter keeps the first ones and
    the rest in one field (``folded``), and is written; the entry does not stay pending
    for good (one XADD of them all is past what Lua 5.1 passes to a call), and a fire
    read after it runs."""
    keys = await store.keys()
    many = [x for i in range(5000) for x in (f"f{i}", f"v{i}")]
    await store.client.execute("XADD", keys.queue("m"), "*", *many)
    fields = ("task_id", "ok", "payload", "null", "attempt", "0", "due_ms", "1000")
    await store.client.execute("XADD", keys.queue("m"), "*", *fields)
    config = node_config(redis_url, namespace, tmp_path, {"m": consumer("noop")}, pollers=0)
    async with running_node(config):
        await wait_until(lambda: _stream_len(store, keys.dlq("m"), 1))
        await wait_until(lambda: _async(len(records(record)) == 1))
        await wait_until(lambda: _queue_done(store, "m"))
    ((_, entry),) = await store.client.execute("XRANGE", keys.dlq("m"), "-", "+")
    assert entry[b"reason"] == b"malformed" and entry[b"f0"] == b"v0"
    rest = msgpack.unpackb(entry[b"folded"], raw=True)
    kept = [k for k in entry if k.startswith(b"f") and k != b"folded"]
    assert len(kept) + len(rest) // 2 == 5000 and rest[-2:] == [b"f4999", b"v4999"]


async def _dead_in_history(store: TaskStore, task_id: str) -> bool:
    return [o.fate for o in await task_history(store, task_id)] == ["dead"]


async def test_malformed_message_goes_to_the_dlq(
    store: TaskStore, redis_url: str, namespace: str, tmp_path: Path, record: Path
) -> None:
    keys = await store.keys()
    await store.client.execute("XADD", keys.queue("m"), "*", "hello", "world")
    # Numbers past what a completion packs (another producer's): malformed, each alone; a
    # well-formed fire read with them runs (they failed every write of their batch).
    for attempt, due in (("0", str(2**66)), ("-1", "1000"), ("0", "-5")):
        fields = ("task_id", "odd", "payload", "null", "attempt", attempt, "due_ms", due)
        await store.client.execute("XADD", keys.queue("m"), "*", *fields)
    fields = ("task_id", "ok", "payload", "null", "attempt", "0", "due_ms", "1000")
    await store.client.execute("XADD", keys.queue("m"), "*", *fields, "enq_ms", str(2**64))
    await store.client.execute("XADD", keys.queue("m"), "*", *fields)
    # A policy code whose numbers are no numbers a code holds (a superscript digit, one
    # past 2^64): the part is ignored and the fire runs, its batch with it.
    for task_id, code in (("sup", "S;w²;p³"), ("huge", f"A;l{10**20};s{10**20}")):
        fields = ("task_id", task_id, "payload", "null", "attempt", "0", "due_ms", "1000")
        await store.client.execute("XADD", keys.queue("m"), "*", *fields, "o", code)
    config = node_config(redis_url, namespace, tmp_path, {"m": consumer("noop")}, pollers=0)
    async with running_node(config):
        await wait_until(lambda: _stream_len(store, keys.dlq("m"), 5))
        await wait_until(lambda: _async(len(records(record)) == 3))
    entries = await stream_entries(store, keys.dlq("m"))
    assert [e["reason"] for e in entries] == ["malformed"] * 5
    assert entries[0]["hello"] == "world"
    assert "not a Metronome message" in entries[0]["error"]
    assert all("out of range" in e["error"] for e in entries[1:]), entries
    assert sorted(r["task_id"] for r in records(record)) == ["huge", "ok", "sup"]


async def test_long_handler_keeps_its_lease(
    store: TaskStore, redis_url: str, namespace: str, tmp_path: Path, record: Path
) -> None:
    """A handler running 3x the lease is not reclaimed by another consumer's claimer."""
    section = consumer("sleepy", lease_s=1, timeout_s=30)
    config = node_config(redis_url, namespace, tmp_path, {"long": section})
    await store.create(TaskSpec("long", Schedule("once", at_ms=0), {"sleep_s": 3}, task_id="L"))
    stolen: list[Any] = []
    async with running_node(config):
        await wait_until(lambda: _async(len(records(record)) >= 1))
        for _ in range(12):  # a thief with the same lease tries every 0.25 s
            await trio.sleep(0.25)
            reclaim = await (await store.scripts()).reclaim("long", "thief", 1000, 10, 5, "other")
            stolen += reclaim.claimed
        await wait_until(lambda: _async(sum(r["event"] == "ran" for r in records(record)) == 1))
    assert stolen == []
    assert [r["event"] for r in records(record)] == ["started", "ran"]


async def test_a_slow_type_does_not_delay_a_light_one(
    store: TaskStore, redis_url: str, namespace: str, tmp_path: Path, record: Path,
    debug_log_lines: LogLines,
) -> None:  # fmt: skip
    log_lines = debug_log_lines  # "running" is a debug line
    config = node_config(
        redis_url, namespace, tmp_path,
        {
            "heavy": consumer("sleepy", concurrency=2, timeout_s=120),
            "light": consumer("noop", concurrency=4),
        },
        grace_s=0.5,  # the heavy handlers are cut at the end; they are not the point
    )  # fmt: skip
    await store.create_many(
        [TaskSpec("heavy", Schedule("once", at_ms=0), {"sleep_s": 60}) for _ in range(40)]
    )
    await store.create_many(
        [TaskSpec("light", Schedule("interval", every_s=0.2)) for _ in range(5)]
    )
    async with running_node(config):
        # Light fires keep running while every heavy slot is taken and 38 heavy fires wait.
        await wait_until(
            lambda: _async(
                sum(e["event"] == "finished" and e["type"] == "light" for e in log_lines()) >= 40
            )
        )
    events = log_lines()
    heavy_running = [e for e in events if e["event"] == "running" and e["type"] == "heavy"]
    heavy_done = [e for e in events if e["event"] == "finished" and e["type"] == "heavy"]
    light_done = [e for e in events if e["event"] == "finished" and e["type"] == "light"]
    assert len(heavy_running) == 2  # its two slots are full; 38 wait in its own stream
    assert len(light_done) >= 40 and heavy_done == []  # all of it while heavy was stuck


def test_backoff_doubles_and_is_capped() -> None:
    policy = RetryPolicy(backoff_base_s=10, backoff_cap_s=300, backoff_jitter=0)
    assert [policy.backoff_s(n) for n in (1, 2, 3, 6, 20)] == [10, 20, 40, 300, 300]
    jittered = RetryPolicy(backoff_base_s=10, backoff_jitter=0.5)
    assert all(10 <= jittered.backoff_s(1) <= 15 for _ in range(50))
    assert jittered.backoff_s(1, draw=lambda: 1.0) == 15


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("tests.handlers.jobs", "must look like 'package.module:function'"),
        ("tests.handlers.nope:run", "cannot import 'tests.handlers.nope'"),
        ("tests.handlers.jobs:missing", "has no 'missing'"),
        ("tests.handlers.jobs:not_a_handler", "must take one argument"),
    ],
)
def test_bad_handlers_are_config_errors_naming_the_type(target: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        resolve("email", target)
    assert str(info.value).startswith("consumers.email.handler: ")
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("source", "error", "message"),
    [
        ("def run(ctx:\n", ConfigError, "cannot import '{name}': "),
        ("raise RuntimeError('no server')\n", RuntimeStartError,
         "importing '{name}' failed: RuntimeError: no server"),
    ],
)  # fmt: skip
def test_a_handler_module_that_fails_to_import_is_said_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str, error: type, message: str
) -> None:
    """A handler module with a syntax error is a config error (exit 2: a restart will not
    mend it); one whose own code raises as it is imported (a server away at boot) cannot
    start (exit 1: restarted). Either names the type and the error in one line, not a
    traceback."""
    name = f"broken_{abs(hash(source))}"
    (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(error) as info:
        resolve("email", f"{name}:run")
    assert str(info.value).startswith("consumers.email.handler: ")
    assert message.format(name=name) in str(info.value)


async def _set_idle(store: TaskStore, stream: str, owner: str, msg_id: str) -> None:
    """Make a pending message look abandoned (idle far past any lease)."""
    raw = store.client.raw
    await store.client.run_sync(
        lambda: raw.xclaim(stream, GROUP, owner, 0, [msg_id], idle=10**9, justid=True)
    )


async def _stream_len(store: TaskStore, key: str, length: int) -> bool:
    return int(await store.client.execute("XLEN", key)) == length


async def _queue_done(store: TaskStore, task_type: str) -> bool:
    """Every message of the type acknowledged (entries may stay until trimmed)."""
    (stats,) = (await Queues(store).stats([task_type]))["queues"]
    return bool(stats["length"] == 0)


async def _async(value: bool) -> bool:
    return value


def _jsonl(path: Path) -> list[dict[str, Any]]:
    """The lines of a results log; none before its first (a wait may look that early: an
    empty queue can also be one the poller has not appended to yet)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


async def test_hung_plain_handlers_do_not_starve_the_runs_after_them(
    store: TaskStore, redis_url: str, namespace: str, tmp_path: Path, record: Path,
    log_lines: LogLines,
) -> None:  # fmt: skip
    """A plain (threaded) handler hangs past its timeout: its thread cannot be stopped and
    keeps its slot's thread. The next fire of the type still starts at once, on its first
    attempt, instead of timing out waiting for a thread."""
    section = consumer("sync_sleepy", concurrency=1, timeout_s=0.5, backoff_base_s=30)
    config = node_config(redis_url, namespace, tmp_path, {"hang": section}, grace_s=0.5)
    await store.create(TaskSpec("hang", Schedule("once", at_ms=0), {"sleep_s": 4}, task_id="h"))
    async with running_node(config):
        await wait_records(record, lambda rs: any(r["task_id"] == "h" for r in rs))
        await store.create(
            TaskSpec("hang", Schedule("once", at_ms=0), {"sleep_s": 0}, task_id="next")
        )
        found = await wait_records(
            record, lambda rs: any(r["task_id"] == "next" and r["event"] == "ran" for r in rs)
        )
        # The abandoned thread still runs; the test ends only once it has returned.
        found = await wait_records(
            record, lambda rs: any(r["task_id"] == "h" and r["event"] == "ran" for r in rs)
        )
    (ran,) = [r for r in found if r["task_id"] == "next" and r["event"] == "ran"]
    assert ran["attempt"] == 0  # not a retry after a timeout spent waiting for a thread
    abandoned = [e for e in log_lines() if e["event"] == "handler_thread_abandoned"]
    assert [e["task_id"] for e in abandoned] == ["h"]


@pytest.mark.parametrize("kind", ["tuple_keys", "surrogate", "nan", "unprintable"])
async def test_a_result_json_cannot_carry_is_written_as_text_and_the_batch_runs_once(
    store: TaskStore, redis_url: str, namespace: str, tmp_path: Path, record: Path, kind: str
) -> None:
    """A handler's result that does not encode as JSON must not crash the consumer (its
    whole batch would be released and run again, and again): the fire is a success and
    its results line carries the result as text."""
    config = node_config(redis_url, namespace, tmp_path, {"odd": consumer("odd_result")})
    once = Schedule("once", at_ms=0)
    await store.create(TaskSpec("odd", once, {"kind": kind}, task_id="odd"))
    for i in range(5):
        await store.create(TaskSpec("odd", once, {"kind": "nan"}, task_id=f"n{i}"))
    async with running_node(config):
        await wait_until(lambda: _queue_done(store, "odd"))
        await wait_until(lambda: _async(len(_jsonl(tmp_path / "results-n1.jsonl")) == 6))
    ran = [r["schedule_id"] for r in records(record)]
    assert sorted(ran) == sorted(set(ran)) and len(ran) == 6  # each fire ran once
    lines = {r["task_id"]: r["result"] for r in _jsonl(tmp_path / "results-n1.jsonl")}
    assert isinstance(lines["odd"], str) and lines["n0"] == "nan"
    task = await store.get("odd")
    assert task is not None and (task.runs, task.last_status) == (1, "ok")


@pytest.mark.parametrize("delay", ["inf", "nan", "1e300", "soon"])
async def test_a_retry_later_delay_that_is_no_time_fails_that_run_alone(
    store: TaskStore, redis_url: str, namespace: str, tmp_path: Path, record: Path,
    log_lines: LogLines, delay: str,
) -> None:  # fmt: skip
    """``RetryLater`` with a delay that is not a finite number of seconds (a Retry-After
    header read as inf, a string) is a failed attempt of that run, retried by the
    backoff: not a consumer crash that runs its whole batch again."""
    section = consumer("bad_retry_delay", max_attempts=3, backoff_base_s=0.1, backoff_jitter=0)
    others = consumer("noop")
    config = node_config(redis_url, namespace, tmp_path, {"br": section, "ok": others})
    once = Schedule("once", at_ms=0)
    await store.create(TaskSpec("br", once, {"delay": delay}, task_id="br"))
    for i in range(5):
        await store.create(TaskSpec("ok", once, task_id=f"ok{i}"))
    async with running_node(config):
        await wait_records(
            record, lambda rs: any(r["event"] == "ran" for r in rs if r["task_id"] == "br")
        )
        await wait_until(lambda: _queue_done(store, "br"))
    runs = [(r["task_id"], r["event"], r["attempt"]) for r in records(record)]
    assert sorted(r for r in runs if r[0] == "br") == [("br", "failed", 0), ("br", "ran", 1)]
    assert sorted(r[0] for r in runs if r[0] != "br") == [f"ok{i}" for i in range(5)]
    (retried,) = [e for e in log_lines() if e["event"] == "retried"]
    assert retried["delay_s"] == 0.1  # the backoff's
    assert retried["error"].startswith("ValueError: RetryLater: delay_s must be"), retried


async def test_an_error_text_utf8_cannot_encode_is_kept_escaped_and_the_batch_runs_once(
    store: TaskStore, redis_url: str, namespace: str, tmp_path: Path, record: Path,
    log_lines: LogLines,
) -> None:  # fmt: skip
    """An exception whose text holds a lone surrogate is written (retry context, dead
    letter, log lines) with it escaped: not a write that fails and releases the batch."""
    section = consumer("fails_with_surrogate", max_attempts=2, backoff_base_s=0.05)
    config = node_config(redis_url, namespace, tmp_path, {"s": section, "ok": consumer("noop")})
    once = Schedule("once", at_ms=0)
    await store.create(TaskSpec("s", once, task_id="s"))
    for i in range(5):
        await store.create(TaskSpec("ok", once, task_id=f"ok{i}"))
    keys = await store.keys()
    async with running_node(config):
        await wait_until(lambda: _stream_len(store, keys.dlq("s"), 1))
        await wait_until(lambda: _queue_done(store, "ok"))
    runs = sorted((r["task_id"], r["attempt"]) for r in records(record))
    assert runs == [*((f"ok{i}", 0) for i in range(5)), ("s", 0), ("s", 1)]
    (entry,) = await stream_entries(store, keys.dlq("s"))
    assert "bad byte \\udcff in the reply" in entry["error"]
    (retried,) = [e for e in log_lines() if e["event"] == "retried"]
    assert retried["error"] == "RuntimeError: bad byte \\udcff in the reply"
