"""Overlap policies, catch-up windows and pause on failure, end to end: a real Redis, a
node's tree in-process (and node processes where a fire must run on another node or be
killed), real handlers that record what ran and when."""

from __future__ import annotations

import itertools
import signal
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from actors.api.explain import explain
from actors.config import ConsumerSection
from actors.domain.errors import InvalidTask
from actors.domain.model import TaskSpec
from actors.domain.schedules import Schedule
from actors.store.tasks import TaskStore
from runtime.redis_io import RedisClient
from tests.execution_harness import node_config, records, running_node, wait_records, wait_until
from tests.node_process import NodeProcess


def _store(redis_client: RedisClient, namespace: str) -> TaskStore:
    return TaskStore(redis_client, namespace, default_partitions=4)


def _runs(path: Path, task_id: str) -> list[tuple[int, int, int]]:
    """(due, started, ended) of each run of a task that ended, by start."""
    started: dict[str, int] = {}
    out = []
    for r in records(path):
        if r["task_id"] != task_id:
            continue
        if r["event"] == "started":
            started[r["schedule_id"]] = r["t_ms"]
        elif r["event"] in ("ran", "cancelled") and r["schedule_id"] in started:
            out.append((r["due_ms"], started[r["schedule_id"]], r["t_ms"]))
    return sorted(out, key=lambda run: run[1])


def _assert_one_at_a_time(runs: list[tuple[int, int, int]]) -> None:
    for before, after in itertools.pairwise(runs):
        assert after[1] >= before[2], f"runs overlap: {before} and {after}"


@attrs.define
class Setup:
    """A task of type ``work`` and an in-process node running its handler."""

    store: TaskStore
    url: str
    namespace: str
    tmp_path: Path

    async def task(self, every_s: float, sleep_s: float, **schedule: Any) -> tuple[str, int]:
        """A task every ``every_s`` from half a second from now: (its id, first due)."""
        start_ms = await self.store.now_ms() + 500
        spec = TaskSpec(
            "work",
            Schedule("interval", every_s=every_s, start_ms=start_ms, **schedule),
            {"sleep_s": sleep_s},
        )
        (created,) = await self.store.create_many([spec])
        return created.task_id, start_ms

    def node(self, handler: str = "sleepy") -> AbstractAsyncContextManager[Any]:
        consumers = {"work": ConsumerSection(f"tests.handlers.jobs:{handler}", concurrency=5)}
        return running_node(node_config(self.url, self.namespace, self.tmp_path, consumers))


@pytest.fixture
def setup(redis_client: RedisClient, redis_url: str, namespace: str, tmp_path: Path) -> Setup:
    return Setup(_store(redis_client, namespace), redis_url, namespace, tmp_path)


def _skipped(lines: list[dict[str, Any]], task_id: str) -> list[dict[str, Any]]:
    return [e for e in lines if e["event"] == "not_run" and e["task_id"] == task_id]


async def test_skip_never_runs_a_task_twice_at_once(
    setup: Setup, record: Path, log_lines: Any
) -> None:
    task_id, _ = await setup.task(1, 2.5, overlap="skip")
    async with setup.node():
        await wait_records(record, lambda _: len(_runs(record, task_id)) >= 3, 60)
    runs = _runs(record, task_id)
    _assert_one_at_a_time(runs)
    dues = [due for due, _, _ in runs]
    # Each run takes 2.5 s of a 1 s grid: the grid times between two runs were skipped.
    assert all(b - a >= 2000 for a, b in itertools.pairwise(dues)), dues
    skipped = _skipped(log_lines(), task_id)
    assert skipped and {e["reason"] for e in skipped} == {"overlap"}
    assert all(e["blocking"].startswith(task_id + ":") for e in skipped)
    ran = {f"{task_id}:{d}" for d in dues}
    assert not ran & {e["schedule_id"] for e in skipped}
    facts = await explain(setup.store, task_id)
    assert facts["not_run"]["reason"] == "overlap" and facts["not_run"]["count"] >= len(skipped)
    assert any("skipped (overlap)" in line for line in facts["summary"])


async def test_buffer_all_runs_every_grid_time_one_after_another(
    setup: Setup, redis_client: RedisClient, record: Path
) -> None:
    task_id, start_ms = await setup.task(0.5, 1.0, overlap="buffer_all", max_runs=5)
    async with setup.node():
        await wait_records(record, lambda _: len(_runs(record, task_id)) >= 5, 60)
    runs = _runs(record, task_id)
    _assert_one_at_a_time(runs)
    assert [due for due, _, _ in runs] == [start_ms + k * 500 for k in range(5)]
    keys = await setup.store.keys()
    flight = keys.flights(keys.partition_of(task_id))
    fields = (await redis_client.execute("HGET", flight, task_id)).decode().split("|")
    assert (fields[0], fields[3]) == ("", "")  # nothing in flight, nothing waiting


async def test_buffer_one_keeps_one_waiting_and_skips_the_rest(
    setup: Setup, record: Path, log_lines: Any
) -> None:
    task_id, start_ms = await setup.task(0.5, 2.0, overlap="buffer_one")
    async with setup.node():
        flights: list[dict[str, Any]] = []

        async def one_waits() -> bool:  # a grid time came while the first fire runs
            flights.append((await explain(setup.store, task_id))["flight"])
            return bool(flights[-1] and flights[-1]["waiting"])

        await wait_until(one_waits)
        flight = flights[-1]
        await wait_records(record, lambda _: len(_runs(record, task_id)) >= 3, 60)
    assert flight["in_flight_due_ms"] == start_ms and flight["waiting"] == [start_ms + 500]
    runs = _runs(record, task_id)
    _assert_one_at_a_time(runs)
    dues = [due for due, _, _ in runs]
    # The first fire runs; the next grid time waits for it and starts when it ends; the
    # grid times that came while one was waiting were skipped.
    assert dues[:2] == [start_ms, start_ms + 500], dues
    skipped = _skipped(log_lines(), task_id)
    assert skipped and not {f"{task_id}:{d}" for d in dues} & {e["schedule_id"] for e in skipped}


async def test_cancel_other_cancels_the_run_on_another_node(
    redis_client: RedisClient,
    redis_url: str,
    namespace: str,
    tmp_path: Path,
    record: Path,
    log_lines: Any,
) -> None:
    """The fire runs in a node process; the poller that replaces it runs here."""
    store = _store(redis_client, namespace)
    config = tmp_path / "node.toml"
    config.write_text(
        f'namespace = "{namespace}"\n[node]\nname = "other"\nshutdown_grace_s = 5\n'
        f'[redis]\nurl = "{redis_url}"\n[scheduler]\npollers = 0\npartitions = 4\n'
        f'[execution]\nresults_log = "{tmp_path / "results.jsonl"}"\n'
        'claimer_interval_s = 0.2\n[consumers.work]\nhandler = "tests.handlers.jobs:blocked"\n'
        "concurrency = 5\n"
    )
    node = NodeProcess(config)
    try:
        await trio.to_thread.run_sync(node.wait_for, "consumer_ready")
        start_ms = await store.now_ms() + 500
        schedule = Schedule("interval", every_s=2, start_ms=start_ms, overlap="cancel_other")
        (task,) = await store.create_many([TaskSpec("work", schedule)])
        async with running_node(node_config(redis_url, namespace, tmp_path, {})):
            await wait_records(
                record,
                lambda rs: sum(r["event"] == "cancelled" for r in rs) >= 2,
                60,
            )
        cancelled = await trio.to_thread.run_sync(node.wait_for, "cancelled", 2)
    finally:
        node.signal(signal.SIGTERM)
        await trio.to_thread.run_sync(node.wait)
    runs = _runs(record, task.task_id)
    _assert_one_at_a_time(runs)
    assert [due for due, _, _ in runs[:2]] == [start_ms, start_ms + 2000]
    assert {e["reason"] for e in cancelled} == {"overlap"}
    assert not [e for e in node.events() if e["event"] in ("retried", "dead")]


async def test_a_fire_later_than_the_catchup_window_is_not_run(
    redis_client: RedisClient,
    redis_url: str,
    namespace: str,
    tmp_path: Path,
    record: Path,
    log_lines: Any,
) -> None:
    """Claimed late (the poller starts after the window) and queued late (a backlog the
    consumer reaches after the window): neither runs; a fire in time does."""
    store = _store(redis_client, namespace)
    now = await store.now_ms()
    late = TaskSpec(
        "work", Schedule("once", at_ms=now - 5000, catchup_window_s=2), task_id="late-claim"
    )
    on_time = TaskSpec("work", Schedule("once", at_ms=now, catchup_window_s=60), task_id="ok")
    backlog = TaskSpec("work", Schedule("once", at_ms=now, catchup_window_s=1), task_id="queued")
    await store.create_many([late, on_time, backlog])
    # The poller enqueues while no consumer runs; the consumer comes after the window.
    async with running_node(node_config(redis_url, namespace, tmp_path, {})):
        stream = (await store.keys()).queue("work")
        await wait_until(lambda: _xlen(redis_client, stream, 2))
    await trio.sleep(1.5)
    consumers = {"work": ConsumerSection("tests.handlers.jobs:noop")}
    async with running_node(node_config(redis_url, namespace, tmp_path, consumers)):
        await wait_records(record, lambda rs: any(r["task_id"] == "ok" for r in rs))
        await wait_until(lambda: _pending_done(redis_client, stream))
    assert {r["task_id"] for r in records(record)} == {"ok"}
    not_run = {e["task_id"]: e for e in log_lines() if e["event"] == "not_run"}
    assert not_run["late-claim"]["reason"] == "expired"
    assert not_run["queued"]["reason"] == "expired"


async def _xlen(client: RedisClient, stream: str, count: int) -> bool:
    return int(await client.execute("XLEN", stream)) >= count


async def _pending_done(client: RedisClient, stream: str) -> bool:
    groups = await client.execute("XINFO", "GROUPS", stream)
    return all(int(g[b"pending"] if isinstance(g, dict) else g[5]) == 0 for g in groups)


async def test_a_task_pauses_after_its_fires_end_dead_in_a_row(
    redis_client: RedisClient,
    redis_url: str,
    namespace: str,
    tmp_path: Path,
    record: Path,
    log_lines: Any,
) -> None:
    store = _store(redis_client, namespace)
    start_ms = await store.now_ms() + 300
    schedule = Schedule("interval", every_s=0.3, start_ms=start_ms, pause_after_failures=2)
    (task,) = await store.create_many([TaskSpec("work", schedule)])
    consumers = {"work": ConsumerSection("tests.handlers.jobs:failing", max_attempts=1)}
    async with running_node(node_config(redis_url, namespace, tmp_path, consumers)):
        await wait_until(lambda: _status_is(store, task.task_id, "paused"))
        failed_then = len(records(record))
        await trio.sleep(1.0)  # paused: nothing more runs
        assert len(records(record)) == failed_then
    assert failed_then >= 2
    paused = [e for e in log_lines() if e["event"] == "paused"]
    assert paused and paused[0]["reason"] == "failures" and paused[0]["failures"] == 2
    assert "boom" in paused[0]["error"]
    keys = await store.keys()
    notes = keys.notes(keys.partition_of(task.task_id))
    note = await redis_client.execute("HGET", notes, task.task_id)
    assert note is not None and b"failures" in note


async def _status_is(store: TaskStore, task_id: str, status: str) -> bool:
    task = await store.get(task_id)
    return task is not None and task.status == status


def _node_toml(tmp_path: Path, url: str, namespace: str, name: str) -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(
        f'namespace = "{namespace}"\n[node]\nname = "{name}"\nshutdown_grace_s = 5\n'
        f'[redis]\nurl = "{url}"\n[scheduler]\npollers = 1\npartitions = 4\nmax_tick_s = 0.05\n'
        "claim_lease_ms = 1000\n"
        f'[execution]\nresults_log = "{tmp_path / (name + ".jsonl")}"\nclaimer_interval_s = 0.2\n'
        '[consumers.work]\nhandler = "tests.handlers.jobs:sleepy"\nconcurrency = 5\nlease_s = 2\n'
    )
    return path


async def test_a_node_killed_mid_run_strands_no_skip_task(
    redis_client: RedisClient, redis_url: str, namespace: str, tmp_path: Path, record: Path
) -> None:
    """kill -9 of the node running a skip task's fire: the fire is reclaimed and run by
    another node, its end ends the flight, and the task's later grid times run."""
    store = _store(redis_client, namespace)
    first = NodeProcess(_node_toml(tmp_path, redis_url, namespace, "a"))
    second = None
    try:
        await trio.to_thread.run_sync(first.wait_for, "consumer_ready")
        start_ms = await store.now_ms() + 500
        schedule = Schedule("interval", every_s=1, start_ms=start_ms, overlap="skip")
        (task,) = await store.create_many([TaskSpec("work", schedule, {"sleep_s": 3})])
        started = await wait_records(
            record, lambda rs: [r for r in rs if r["event"] == "started"], 30
        )
        first.proc.kill()  # SIGKILL, mid-run
        await trio.to_thread.run_sync(first.wait)
        killed_ms = await store.now_ms()
        second = NodeProcess(_node_toml(tmp_path, redis_url, namespace, "b"))
        ran = await wait_records(
            record,
            lambda rs: [r for r in rs if r["event"] == "ran" and r["due_ms"] > killed_ms],
            90,
        )
    finally:
        for node in (first, second):
            if node is not None and node.proc.poll() is None:
                node.signal(signal.SIGTERM)
                await trio.to_thread.run_sync(node.wait)
    by_second = [r for r in records(record) if r["pid"] == second.proc.pid]
    # The fire the killed node was running ran again elsewhere, then the grid went on.
    assert started[0]["schedule_id"] in {r["schedule_id"] for r in by_second}
    assert ran
    _assert_one_at_a_time([r for r in _runs(record, task.task_id) if r[1] > killed_ms])


async def test_a_trigger_under_buffer_all_waits_for_the_fire_in_flight(
    setup: Setup, record: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two triggers of a skip task in one millisecond, each under buffer_all: the second
    is a fire of its own (a time 1 ms on), which waits for the first to end, then starts
    (the poller wakes the task to start it)."""
    store = setup.store
    schedule = Schedule(
        "interval", every_s=3600, start_ms=await store.now_ms() + 3_600_000, overlap="skip"
    )
    (task,) = await store.create_many([TaskSpec("work", schedule, {"sleep_s": 1.5})])
    at = await store.now_ms()

    async def one_millisecond() -> int:
        return at

    monkeypatch.setattr(store, "now_ms", one_millisecond)
    async with setup.node():
        first, queued_first = await store.trigger(task.task_id, "buffer_all")
        second, queued_second = await store.trigger(task.task_id, "buffer_all")
        assert (first, second) == (f"{task.task_id}:{at}", f"{task.task_id}:{at + 1}")
        assert (queued_first, queued_second) == (True, False)
        await wait_records(record, lambda _: len(_runs(record, task.task_id)) >= 2, 60)
    runs = _runs(record, task.task_id)
    _assert_one_at_a_time(runs)
    assert [f"{task.task_id}:{due}" for due, _, _ in runs] == [first, second]


async def test_triggers_in_one_millisecond_or_on_a_grid_time_are_fires_of_their_own(
    setup: Setup, redis_client: RedisClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Triggers of a task without a policy in one millisecond (a double click, two API
    nodes) each get a time of their own, and so does one made at one of the task's grid
    times: sharing a schedule_id, all but one were dropped as duplicates by the consumers'
    dedupe window though each was answered queued."""
    store = setup.store
    task_id, first_due = await setup.task(60, 0.0)
    at = first_due

    async def grid_time() -> int:
        return at

    monkeypatch.setattr(store, "now_ms", grid_time)
    sids = [(await store.trigger(task_id, "allow_all"))[0] for _ in range(3)]
    assert sids == [f"{task_id}:{at + n}" for n in (1, 2, 3)]
    keys = await store.keys()
    entries = await redis_client.execute("XRANGE", keys.queue("work"), "-", "+")
    dues = [int(fields[b"due_ms"]) for _, fields in entries]
    assert dues == [at + 1, at + 2, at + 3]
    # A grid of 1 ms has every millisecond on it: the trigger takes the next one all the same.
    (every_ms,) = await store.create_many(
        [TaskSpec("work", Schedule("interval", every_s=0.001, start_ms=at))]
    )
    with trio.fail_after(10):
        sid, _ = await store.trigger(every_ms.task_id, "allow_all")
    assert sid == f"{every_ms.task_id}:{at + 1}"


async def test_a_policy_that_holds_fires_back_needs_one_on_the_task(setup: Setup) -> None:
    """A task of no overlap policy has no poller release a waiting fire of it: a call may
    skip, never hold back, and says why."""
    store = setup.store
    (task,) = await store.create_many([TaskSpec("work", Schedule("interval", every_s=3600))])
    for overlap in ("buffer_one", "buffer_all", "cancel_other"):
        with pytest.raises(InvalidTask, match="overlap policy of its own"):
            await store.trigger(task.task_id, overlap)
    _, queued = await store.trigger(task.task_id, "skip")
    assert queued


async def test_a_finished_task_takes_no_policy_that_holds_fires_back(setup: Setup) -> None:
    """No poller claims a finished task, so none would start a fire held back behind its
    fire in flight: a trigger or backfill of it may skip, never hold back, and says why
    (a backfill's default is the task's own policy)."""
    store = setup.store
    now = await store.now_ms()
    ended = Schedule("interval", every_s=60, start_ms=now - 7_200_000, end_ms=now - 3_600_000,
                     overlap="buffer_all")  # fmt: skip
    (task,) = await store.create_many([TaskSpec("work", ended)])

    async def finished() -> bool:
        got = await store.get(task.task_id)
        return got is not None and got.status == "finished"

    async with setup.node():  # its poller finds the grid ended
        await wait_until(finished)
    for overlap in ("buffer_one", "buffer_all", "cancel_other"):
        with pytest.raises(InvalidTask, match="is finished"):
            await store.trigger(task.task_id, overlap)
    with pytest.raises(InvalidTask, match="is finished"):
        await store.backfill(task.task_id, now - 7_200_000, now - 3_600_000)
    done = await store.backfill(task.task_id, now - 7_200_000, now - 3_600_000, overlap="skip")
    assert done.enqueued <= 1  # behind the fire in flight (if any), the others skipped
    keys = await store.keys()
    flight = await store.client.execute(
        "HGET", keys.flights(keys.partition_of(task.task_id)), task.task_id
    )
    assert flight is None or flight.split(b"|")[3] == b""  # none left waiting for good
    _, queued = await store.trigger(task.task_id, "allow_all")
    assert queued


async def test_a_schedule_replaced_with_allow_all_drops_the_fires_waiting(setup: Setup) -> None:
    """No claim starts a waiting fire of a task of no policy: they go with the change."""
    store = setup.store
    schedule = Schedule("interval", every_s=3600, overlap="buffer_all")
    (task,) = await store.create_many([TaskSpec("work", schedule)])
    keys = await store.keys()
    flights = keys.flights(keys.partition_of(task.task_id))
    await store.trigger(task.task_id, "buffer_all")
    await trio.sleep(0.01)  # a later millisecond: another fire, which waits
    await store.trigger(task.task_id, "buffer_all")
    assert (await explain(store, task.task_id))["flight"]["waiting_count"] == 1
    await store.update(task.task_id, schedule=Schedule("interval", every_s=3600))
    assert await store.client.execute("HGET", flights, task.task_id) is None


async def test_a_cancel_request_redis_rejects_holds_up_no_other_fire(
    setup: Setup, redis_client: RedisClient, record: Path, log_lines: Any
) -> None:
    """The type's cancel hash holds a string, so every cancel request a ``cancel_other``
    fire makes is rejected (WRONGTYPE). The poller leaves those requests out with a
    ``cancels_not_sent`` line and goes on: a plain task of the same poller keeps firing
    (waiting the rejection out held up every partition and type it serves), and the
    replaced fire runs to its end, its replacement after it."""
    replacing, _ = await setup.task(1, 3.0, overlap="cancel_other")
    plain, _ = await setup.task(0.5, 0.01)
    keys = await setup.store.keys()
    await redis_client.execute("SET", keys.cancels("work"), "not a hash")
    async with setup.node():
        await wait_until(lambda: _said(log_lines, "cancels_not_sent"))
        ran = len(_runs(record, plain))
        await wait_records(record, lambda _: len(_runs(record, plain)) >= ran + 6, 60)
        await wait_records(record, lambda _: len(_runs(record, replacing)) >= 2, 60)
    (line, *_) = [e for e in log_lines() if e["event"] == "cancels_not_sent"]
    assert line["type"] == "work" and "WRONGTYPE" in line["error"]
    assert not [e for e in log_lines() if e["event"] == "actor_crashed"]


async def test_a_cancel_request_for_a_fire_that_ended_goes_with_its_ack(
    setup: Setup, redis_client: RedisClient, record: Path
) -> None:
    """A request for a ``cancel_other`` fire that ends before its consumer looks (asked here
    before it runs, its handler done at once) is removed with the fire's ACK: left, it
    would stay in a busy type's cancel hash for good, the hash's expiry pushed on by every
    later request. A plain fire's request is left alone."""
    replacing, due = await setup.task(60, 0.0, overlap="cancel_other")
    plain, plain_due = await setup.task(60, 0.0)
    keys = await setup.store.keys()
    cancels = keys.cancels("work")
    sids = [f"{replacing}:{due}", f"{plain}:{plain_due}", "other:1"]
    await redis_client.execute("HSET", cancels, *[x for sid in sids for x in (sid, "1")])
    async with setup.node():
        await wait_records(record, lambda rs: sum(r["event"] == "ran" for r in rs) >= 2, 60)

        async def gone() -> bool:
            return bool(await redis_client.execute("HEXISTS", cancels, sids[0]) == 0)

        await wait_until(gone, 30)
    assert {k.decode() for k in await redis_client.execute("HKEYS", cancels)} == set(sids[1:])


async def test_a_cancel_request_made_while_a_fire_waits_for_its_retry_cancels_the_retry(
    setup: Setup, record: Path
) -> None:
    """A trigger under ``cancel_other`` asks to cancel the task's fire while it waits for
    its retry: the retry's message, appended after the request, is cancelled once it runs
    (the request stays while the fire is retried), and the trigger's fire runs after it."""
    task_id, due = await setup.task(3600, 0.0, overlap="cancel_other")
    async with setup.node("fails_then_blocks"):
        await wait_records(record, lambda rs: any(r["event"] == "failed" for r in rs), 30)
        sid, queued = await setup.store.trigger(task_id, "cancel_other")  # within the 2 s
        assert not queued
        await wait_records(
            record,
            lambda rs: (
                any(r["event"] == "cancelled" and r["attempt"] == 1 for r in rs)
                and any(r["schedule_id"] == sid for r in rs)
            ),
            30,
        )
    cancelled = [r["schedule_id"] for r in records(record) if r["event"] == "cancelled"]
    assert cancelled[0] == f"{task_id}:{due}"


@pytest.mark.parametrize("own", ["skip", "buffer_one"])
async def test_a_trigger_under_cancel_other_cancels_the_running_fire_whatever_the_tasks_policy(
    setup: Setup, redis_client: RedisClient, record: Path, own: str
) -> None:
    """An operator's trigger under ``cancel_other`` of a task whose own policy is another
    (``skip``, ``buffer_one``) cancels the task's running fire, as the API says, and its
    own fire runs once that one has ended; the request goes with the cancelled fire."""
    task_id, due = await setup.task(3600, 0.0, overlap=own)
    async with setup.node("blocked"):
        await wait_records(record, lambda rs: any(r["event"] == "started" for r in rs), 30)
        sid, queued = await setup.store.trigger(task_id, "cancel_other")
        assert not queued  # waits for the running fire to end
        await wait_records(
            record,
            lambda rs: any(r["event"] == "started" and r["schedule_id"] == sid for r in rs),
            30,
        )
    cancelled = [r["schedule_id"] for r in records(record) if r["event"] == "cancelled"]
    assert cancelled[0] == f"{task_id}:{due}"  # (the trigger's, at the node's stop, next)
    keys = await setup.store.keys()
    assert await redis_client.execute("HEXISTS", keys.cancels("work"), f"{task_id}:{due}") == 0


async def _said(log_lines: Any, event: str) -> bool:
    return any(e["event"] == event for e in log_lines())
