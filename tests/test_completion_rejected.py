"""A partition whose outcome writes Redis rejects (a key of another kind in it, a record
no script can read) holds back its own fires' completion only: the consumer writes and
acknowledges every other partition's fires meanwhile, keeps the held ones pending (their
leases renewed, never run again), and completes them once the key is mended."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio
from redis.exceptions import ResponseError

from actors.config import ConsumerSection
from actors.domain.model import TaskSpec
from actors.domain.schedules import Schedule
from actors.execution import held_back
from actors.execution.completion import Outcome, RetryPolicy, decide
from actors.execution.flight import Flight
from actors.execution.held_back import Batch, HeldBack
from actors.store.completion_writes import CompletionWrite
from actors.store.history import decode_ring
from actors.store.keys import GROUP, Keys
from actors.store.messages import Message
from actors.store.tasks import TaskStore
from runtime.redis_io import RedisClient
from tests.execution_harness import node_config, periodic_tasks, records, running_node, wait_until

LogLines = Callable[[], list[dict[str, Any]]]


async def _true(value: bool) -> bool:
    return value


async def _pending_ids(store: TaskStore, task_type: str) -> set[str]:
    keys = await store.keys()
    try:
        entries = await store.client.execute_unparsed(
            "XPENDING", keys.queue(task_type), GROUP, "-", "+", 1000
        )
    except ResponseError as exc:  # the consumer has not created its group yet
        if "NOGROUP" not in str(exc):
            raise
        return set()
    return {e[0].decode() for e in entries}


async def _fewest_runs(store: TaskStore, task_ids: list[str]) -> int:
    """The fewest runs any of these tasks has recorded."""
    tasks = await store.get_many(task_ids)
    assert all(t is not None for t in tasks)
    return min(t.runs for t in tasks if t is not None)


async def _each_ran_once_and_in_order(
    client: RedisClient, keys: Keys, record: Path, log_lines: LogLines, task_ids: list[str]
) -> None:
    """Every fire ran once, each task's history is in the order its fires ran (newest
    first), and no actor crashed."""
    counts = Counter(r["schedule_id"] for r in records(record))
    assert max(counts.values()) == 1, counts.most_common(3)
    for t in task_ids:
        raw = await client.execute("HGET", keys.history(keys.partition_of(t)), t)
        dues = [o.due_ms for o in decode_ring(raw)]
        assert dues == sorted(dues, reverse=True), (t, dues)
    assert not [e for e in log_lines() if e["event"] == "actor_crashed"]


async def test_a_partition_whose_outcomes_are_rejected_holds_back_its_own_fires_only(
    redis_client: RedisClient, redis_url: str, namespace: str, tmp_path: Path, record: Path,
    log_lines: LogLines,
) -> None:  # fmt: skip
    """Two partitions' history keys hold a string: every outcome write there fails with
    WRONGTYPE. The other partitions' fires keep being written and acknowledged (their
    tasks' run counts go on); the two's fires ran once each and stay pending, each
    partition said in one ``completions_held_back`` line. Once one key is removed, that
    partition's fires are completed while the other's stay held; once both are, every fire
    is acknowledged, run once, and each task's history is in the order its fires ran (a
    later fire's outcome never written before a held earlier one's)."""
    store = TaskStore(redis_client, namespace, default_partitions=4)
    section = ConsumerSection(handler="tests.handlers.jobs:noop", lease_s=10)
    config = node_config(redis_url, namespace, tmp_path, {"work": section})
    ids, _ = await periodic_tasks(store, count=16, every_s=0.5)
    keys = await store.keys()
    by_partition: dict[int, list[str]] = {}
    for t in ids:
        by_partition.setdefault(keys.partition_of(t), []).append(t)
    first, second, *healthy = sorted(by_partition)
    others = [t for p in healthy for t in by_partition[p]]
    assert others
    for p in (first, second):
        await redis_client.execute("SET", keys.history(p), "not a hash")

    async def others_completing() -> bool:
        return await _fewest_runs(store, others) >= 6

    async def pending_in(partition: int) -> int:
        pending = await _pending_ids(store, "work")
        entries = await redis_client.execute("XRANGE", keys.queue("work"), "-", "+")
        return sum(
            msg_id.decode() in pending
            and keys.partition_of(fields[b"task_id"].decode()) == partition
            for msg_id, fields in entries
        )

    async with running_node(config):
        await wait_until(others_completing)
        for p in (first, second):  # their fires ran and wait, pending, for their outcomes
            assert any(keys.partition_of(r["task_id"]) == p for r in records(record))
            assert await pending_in(p) >= len(by_partition[p])
        with pytest.raises(ResponseError, match="WRONGTYPE"):
            await store.get(by_partition[first][0])
        held = [e for e in log_lines() if e["event"] == "completions_held_back"]
        assert sorted(e["partition"] for e in held) == [first, second]
        assert all("WRONGTYPE" in e["error"] for e in held)
        await redis_client.execute("DEL", keys.history(second))

        async def second_done() -> bool:
            return await pending_in(second) == 0

        await wait_until(second_done)
        assert await pending_in(first) >= len(by_partition[first])  # still held
        await redis_client.execute("DEL", keys.history(first))

        async def settled() -> bool:
            return (
                not await _pending_ids(store, "work")
                and await _fewest_runs(store, by_partition[first]) >= 3
            )

        await wait_until(settled)
    resumed = [e["partition"] for e in log_lines() if e["event"] == "completions_resumed"]
    assert resumed == [second, first]
    await _each_ran_once_and_in_order(
        redis_client, keys, record, log_lines, by_partition[first] + by_partition[second]
    )


async def test_past_the_most_held_a_batch_waits_and_the_held_go_first_once_mended(
    redis_client: RedisClient, redis_url: str, namespace: str, tmp_path: Path, record: Path,
    log_lines: LogLines, monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """With room for 2 held fires, a rejected partition's later fires wait on the
    rejection (``redis_refused``) instead; once the key is removed the held fires are
    written first, then the waiting batch: every fire once, histories in order."""
    monkeypatch.setattr(held_back, "HELD_MAX", 2)
    store = TaskStore(redis_client, namespace, default_partitions=4)
    section = ConsumerSection(handler="tests.handlers.jobs:noop", lease_s=10)
    config = node_config(redis_url, namespace, tmp_path, {"work": section})
    ids, _ = await periodic_tasks(store, count=8, every_s=0.5)
    keys = await store.keys()
    broken = keys.partition_of(ids[0])
    in_broken = [t for t in ids if keys.partition_of(t) == broken]
    await redis_client.execute("SET", keys.history(broken), "not a hash")

    async def waiting() -> bool:
        return any(
            e["event"] == "redis_refused" and e.get("kind") == "rejected" for e in log_lines()
        )

    async with running_node(config):
        await wait_until(waiting)
        await redis_client.execute("DEL", keys.history(broken))

        async def settled() -> bool:
            return not await _pending_ids(store, "work")

        await wait_until(settled)
        ran = len(records(record))
        await wait_until(lambda: _true(len(records(record)) > ran + 8))
        await wait_until(settled)
    await _each_ran_once_and_in_order(redis_client, keys, record, log_lines, in_broken)


async def test_past_the_most_held_a_later_fire_is_never_written_ahead_of_the_held(
    redis_client: RedisClient, redis_url: str, namespace: str, tmp_path: Path, record: Path,
    log_lines: LogLines, monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """A rejection that depends on the row: the task's partition's errors hash holds a
    string, so only a failed fire's outcome write there is rejected. The task's first fire
    fails and is held; with room for one held fire, its later fires (which alone would be
    written: they succeed) wait behind it, pending (``redis_refused``), instead of being
    written ahead of it. Once the key is removed every fire is written in the order they
    ran (the task's last run is its latest fire's), none run twice."""
    monkeypatch.setattr(held_back, "HELD_MAX", 1)
    store = TaskStore(redis_client, namespace, default_partitions=4)
    section = ConsumerSection(
        handler="tests.handlers.jobs:fails_on_due", max_attempts=1, lease_s=10
    )
    config = node_config(redis_url, namespace, tmp_path, {"work": section})
    keys = await store.keys()
    start_ms = await store.now_ms() + 1000
    schedule = Schedule("interval", every_s=0.5, start_ms=start_ms, misfire="fire_all")
    await store.create(TaskSpec("work", schedule, {"due_ms": start_ms}, task_id="t"))
    partition = keys.partition_of("t")
    await redis_client.execute("SET", keys.errors(partition), "not a hash")

    async def waiting_behind() -> bool:
        return len(await _pending_ids(store, "work")) >= 4

    async with running_node(config):
        await wait_until(waiting_behind)
        assert any(
            e["event"] == "redis_refused" and e.get("kind") == "rejected" for e in log_lines()
        )
        await redis_client.execute("DEL", keys.errors(partition))

        async def settled() -> bool:
            return not await _pending_ids(store, "work")

        await wait_until(settled)
    await _each_ran_once_and_in_order(redis_client, keys, record, log_lines, ["t"])
    raw = await redis_client.execute("HGET", keys.history(partition), "t")
    assert start_ms in [o.due_ms for o in decode_ring(raw)]
    task = await store.get("t")
    assert task is not None and task.last_status == "ok"


async def test_a_held_back_fire_ends_the_wait_for_it_to_settle() -> None:
    """A suspect's turn waits for its fire to settle; a fire held back (its partition
    rejected) ran and survived, so the turn ends then, not once the partition is mended
    (the process's reads stay closed during a turn). It stays in flight until settled."""
    flight = Flight()
    message = Message("1-1", "t", "t:1", "work", "null", 0, 1, 1, None)
    flight.messages[message.msg_id] = message
    outcome = Outcome(message, 1, 2)
    async with trio.open_nursery() as nursery:
        ended = trio.Event()

        async def turn() -> None:
            await flight.until_settled(message.msg_id)
            ended.set()

        nursery.start_soon(turn)
        await trio.sleep(0.05)
        assert not ended.is_set()
        flight.held_back([outcome])
        with trio.fail_after(5):
            await ended.wait()
    assert message.msg_id in flight.messages  # renewed until its outcome is written
    with trio.fail_after(5):
        await flight.until_settled(message.msg_id)  # a turn that starts now waits not
    flight.settled([outcome])
    assert not flight.messages and not flight.held


class _Scripts:
    """``ExecutionScripts.complete`` for ``HeldBack.try_all``: each write's answer from
    ``answer`` (by its task id; an error other than Redis's raised, as a write that cannot
    be built), every call's task ids kept."""

    def __init__(self, answer: Callable[[str], Exception | None]) -> None:
        self.answer = answer
        self.calls: list[list[str]] = []

    async def complete(self, writes: list[CompletionWrite]) -> list[Exception | None]:
        self.calls.append([w.outcomes[0].task_id for w in writes])
        answers = [self.answer(w.outcomes[0].task_id) for w in writes]
        for a in answers:
            if a is not None and not isinstance(a, ResponseError):
                raise a
        return answers


def _held(task_id: str, due_ms: int) -> Batch:
    message = Message(f"{due_ms}-{task_id}", task_id, f"{task_id}:{due_ms}", "work", "null",
                      0, due_ms, due_ms, None)  # fmt: skip
    outcome = Outcome(message, due_ms, due_ms + 1)
    plan = decide([outcome], RetryPolicy(), "n1")
    write = CompletionWrite("work", outcomes=plan.outcomes, acks=plan.acks)
    return [outcome], plan, write


async def test_a_try_sends_a_rejected_head_once_and_a_batch_that_cannot_be_built_fails() -> None:
    """Two held partitions: one still rejected, one whose two batches now go through.
    One try writes both of the second's, in order, and sends the first's head once (each
    send writes again what a partly failed write applied). A head that cannot be built
    (not Redis's answer) fails the try once the others are settled: the consumer fails,
    as it does on a flush of such a batch."""
    keys = Keys("ns", 4)
    ids = [f"t{i}" for i in range(100)]
    broken = ids[0]
    fine = next(t for t in ids if keys.partition_of(t) != keys.partition_of(broken))
    held = HeldBack("node/consumers/work/consumer", "work", keys.partition_of)
    flight = Flight()
    rejected = ResponseError("WRONGTYPE Operation against a key holding the wrong kind")

    def hold(batch: Batch) -> None:
        message = batch[0][0].message
        flight.messages[message.msg_id] = message
        held.hold(batch, {keys.partition_of(message.task_id): rejected}, flight)

    for batch in (_held(broken, 1), _held(fine, 1), _held(fine, 2)):
        hold(batch)
    said: list[list[str]] = []
    scripts: Any = _Scripts(lambda t: rejected if t == broken else None)
    await held.try_all(scripts, flight, lambda plan, _: said.append(list(plan.acks)))
    assert scripts.calls == [[broken, fine], [fine]]
    assert said == [[f"1-{fine}"], [f"2-{fine}"]]
    assert list(held.queues) == [keys.partition_of(broken)]
    assert set(flight.messages) == {f"1-{broken}"}
    # The broken one now cannot be built: its error is raised once the fine one is written.
    hold(_held(fine, 3))
    scripts = _Scripts(lambda t: TypeError("cannot encode") if t == broken else None)
    with pytest.raises(TypeError, match="cannot encode"):
        await held.try_all(scripts, flight, lambda plan, _: said.append(list(plan.acks)))
    assert said[-1] == [f"3-{fine}"] and list(held.queues) == [keys.partition_of(broken)]


async def test_a_dead_letter_stream_redis_rejects_holds_back_the_dead_fires_partitions_only(
    redis_client: RedisClient, redis_url: str, namespace: str, tmp_path: Path, record: Path,
    log_lines: LogLines,
) -> None:  # fmt: skip
    """The type's dead-letter stream holds a string: a batch with a dead fire cannot write
    its dead letter (WRONGTYPE). The dead fire's partition is held back, its fire pending
    (never run again), and every other partition's fires are written and acknowledged
    meanwhile, where the whole type used to wait behind that one batch. Once the key is
    removed the dead letter is written and everything settles, each fire run once."""
    store = TaskStore(redis_client, namespace, default_partitions=4)
    section = ConsumerSection(handler="tests.handlers.jobs:fails_on_due", max_attempts=1)
    config = node_config(redis_url, namespace, tmp_path, {"work": section})
    keys = await store.keys()
    start_ms = await store.now_ms() + 1000
    schedule = Schedule("interval", every_s=0.5, start_ms=start_ms, misfire="fire_all")
    ids = [f"t{i}" for i in range(16)]
    doomed = ids[0]  # its first fire fails, and is dead at once
    await store.create_many(
        [TaskSpec("work", schedule, {"due_ms": start_ms if t == doomed else 0}, t) for t in ids]
    )
    held_partition = keys.partition_of(doomed)
    others = [t for t in ids if keys.partition_of(t) != held_partition]
    assert others
    await redis_client.execute("SET", keys.dlq("work"), "not a stream")

    async def others_completing() -> bool:
        return await _fewest_runs(store, others) >= 6

    async with running_node(config):
        await wait_until(others_completing)
        held = [e for e in log_lines() if e["event"] == "completions_held_back"]
        assert [e["partition"] for e in held] == [held_partition]
        assert "WRONGTYPE" in held[0]["error"]
        assert await redis_client.execute("TYPE", keys.dlq("work")) == b"string"
        await redis_client.execute("DEL", keys.dlq("work"))

        async def settled() -> bool:
            dead = await redis_client.execute("XLEN", keys.dlq("work"))
            return dead == 1 and not await _pending_ids(store, "work")

        await wait_until(settled)
    (entry,) = await redis_client.execute("XRANGE", keys.dlq("work"), "-", "+")
    assert entry[1][b"task_id"] == doomed.encode() and entry[1][b"due_ms"] == str(start_ms).encode()
    resumed = [e["partition"] for e in log_lines() if e["event"] == "completions_resumed"]
    assert resumed == [held_partition]
    await _each_ran_once_and_in_order(redis_client, keys, record, log_lines, ids)


async def test_a_malformed_entry_whose_dead_letter_redis_rejects_stops_no_read(
    redis_client: RedisClient, redis_url: str, namespace: str, tmp_path: Path, record: Path,
    log_lines: LogLines,
) -> None:  # fmt: skip
    """An entry that is not a Metronome message, read while the type's dead-letter stream
    holds a string: it is left pending (``malformed_held``) and the fires read with it and
    after it run, where the reads used to wait on that key. Once the key is removed it is
    dead-lettered, taken over after its lease."""
    store = TaskStore(redis_client, namespace, default_partitions=4)
    keys = await store.keys()
    stream = keys.queue("m")
    await redis_client.execute("SET", keys.dlq("m"), "not a stream")
    await redis_client.execute("XADD", stream, "*", "hello", "world")
    for task_id in ("first", "second"):
        fields = ("task_id", task_id, "payload", "null", "attempt", "0", "due_ms", "1000")
        await redis_client.execute("XADD", stream, "*", *fields)
    section = ConsumerSection(handler="tests.handlers.jobs:noop", lease_s=1, max_deliveries=3)
    config = node_config(redis_url, namespace, tmp_path, {"m": section}, pollers=0)
    async with running_node(config):
        await wait_until(
            lambda: _true({r["task_id"] for r in records(record)} == {"first", "second"})
        )
        held = [e for e in log_lines() if e["event"] == "malformed_held"]
        assert held and "WRONGTYPE" in held[0]["error"]
        await redis_client.execute("DEL", keys.dlq("m"))

        async def dead_lettered() -> bool:
            return bool(await redis_client.execute("XLEN", keys.dlq("m")) == 1)

        await wait_until(dead_lettered)
    (entry,) = await redis_client.execute("XRANGE", keys.dlq("m"), "-", "+")
    assert entry[1][b"hello"] == b"world"
    assert not await _pending_ids(store, "m")
    assert not [e for e in log_lines() if e["event"] == "actor_crashed"]


async def test_a_task_whose_run_record_cannot_be_decoded_holds_back_no_other_fire(
    redis_client: RedisClient, redis_url: str, namespace: str, tmp_path: Path, record: Path,
    log_lines: LogLines,
) -> None:  # fmt: skip
    """One task's run record holds bytes no version writes (a hand edit, another program):
    the other tasks of its partition go on completing (their runs counted, no partition
    held back, as when that record failed the whole partition's outcome call); its own
    fires run, go to its history and are named in ``task_unreadable`` lines, its record
    left as it is."""
    store = TaskStore(redis_client, namespace, default_partitions=4)
    section = ConsumerSection(handler="tests.handlers.jobs:noop", lease_s=10)
    config = node_config(redis_url, namespace, tmp_path, {"work": section})
    ids, _ = await periodic_tasks(store, count=16, every_s=0.5)
    keys = await store.keys()
    bad = ids[0]
    neighbours = [t for t in ids[1:] if keys.partition_of(t) == keys.partition_of(bad)]
    assert neighbours
    runs_key = keys.runs(keys.partition_of(bad), keys.bucket_of(bad))
    await redis_client.execute("HSET", runs_key, bad, b"\xcd\x01")

    async def neighbours_completing() -> bool:
        return await _fewest_runs(store, neighbours) >= 4

    async def bad_in_history() -> bool:
        raw = await redis_client.execute("HGET", keys.history(keys.partition_of(bad)), bad)
        return raw is not None and len(decode_ring(raw)) >= 3

    async with running_node(config):
        await wait_until(neighbours_completing)
        await wait_until(bad_in_history)
    assert not [e for e in log_lines() if e["event"] == "completions_held_back"]
    named = [e for e in log_lines() if e["event"] == "task_unreadable"]
    assert named and {e["task_id"] for e in named} == {bad}
    assert await redis_client.execute("HGET", runs_key, bad) == b"\xcd\x01"
    assert sum(r["task_id"] == bad for r in records(record)) >= 3
