"""Backfill in the task store against a real Redis: which grid times a window holds (cron
across DST changes, interval grids, schedule bounds), what lands in the stream (read back
with XRANGE and decoded as a consumer decodes it), idempotence, and the refusals. The API,
the client and the CLI: test_backfill_api.py and test_cli.py."""

from __future__ import annotations

import datetime as dt
import zoneinfo
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from actors.config import ConsumerSection
from actors.domain.errors import InvalidTask, InvalidTransition, TaskNotFound
from actors.domain.model import TaskSpec
from actors.domain.schedules import Misfire, Schedule
from actors.store.backfill import RETENTION_MS
from actors.store.history import DEFAULT_HISTORY, decode_ring
from actors.store.keys import LAYOUT_VERSION, Keys
from actors.store.messages import Message, flat_fields
from actors.store.tasks import TaskStore
from runtime.redis_io import RedisClient
from tests.execution_harness import node_config, records, running_node, wait_until

PARIS = zoneinfo.ZoneInfo("Europe/Paris")
MINUTE, HOUR, DAY = 60_000, 3_600_000, 86_400_000


def paris_ms(year: int, month: int, day: int, hour: int = 0, minute: int = 0) -> int:
    return int(dt.datetime(year, month, day, hour, minute, tzinfo=PARIS).timestamp() * 1000)


@pytest.fixture
async def store(redis_client: RedisClient, namespace: str) -> TaskStore:
    return TaskStore(redis_client, namespace, default_partitions=4)


async def stream(store: TaskStore, task_type: str) -> list[Message]:
    keys = await store.keys()
    entries = await store.client.execute("XRANGE", keys.queue(task_type), "-", "+")
    return [Message.decode(i, flat_fields(f), task_type) for i, f in entries]


def walk(schedule: Schedule, first: int, end_ms: int) -> list[int]:
    """The grid as the poller walks it: from one grid time, ``next_after`` after another."""
    out: list[int] = []
    due: int | None = first
    while due is not None and due < end_ms:
        out.append(due)
        due = schedule.next_after(due)
    return out


async def make(store: TaskStore, task_id: str, schedule: Schedule, kind: str = "report") -> None:
    await store.create(TaskSpec(kind, schedule, {"id": task_id}, task_id))


async def test_a_cron_backfill_across_both_dst_changes_enqueues_the_grid_once(
    store: TaskStore, log_lines: Callable[[], list[dict[str, Any]]]
) -> None:
    # Daily at 02:30 in Paris: on 2024-03-31 02:30 does not exist (fires at 03:00); every
    # 30 minutes: on 2024-10-27 02:00-02:59 happens twice, and fires on both sides.
    daily = Schedule("cron", cron="30 2 * * *", tz="Europe/Paris")
    halves = Schedule("cron", cron="*/30 * * * *", tz="Europe/Paris")
    await make(store, "daily", daily)
    await make(store, "halves", halves)
    start, end = paris_ms(2024, 3, 28), paris_ms(2024, 4, 3)
    dry = await store.backfill("daily", start, end, dry_run=True)
    keys = await store.keys()
    assert not await store.client.execute("EXISTS", keys.queue("report"))
    assert not await store.client.execute("EXISTS", keys.backfilled("report", "daily"))
    expected = walk(daily, paris_ms(2024, 3, 28, 2, 30), end)
    assert list(dry.fires) == expected and len(expected) == 6
    assert paris_ms(2024, 3, 31, 3, 0) in expected  # the DST gap's first valid minute
    assert (dry.enqueued, dry.already) == (0, 0)

    done = await store.backfill("daily", start, end)
    assert (list(done.fires), done.enqueued, done.already) == (expected, 6, 0)
    messages = await stream(store, "report")
    assert [(m.task_id, m.due_ms, m.attempt, m.payload) for m in messages] == [
        ("daily", due, 0, {"id": "daily"}) for due in expected
    ]
    assert [m.schedule_id for m in messages] == [f"daily:{due}" for due in expected]

    again = await store.backfill("daily", start, end)
    assert (again.enqueued, again.already) == (0, 6)
    assert len(await stream(store, "report")) == 6
    ttl = await store.client.execute("PTTL", keys.backfilled("report", "daily"))
    assert 0 < ttl <= RETENTION_MS
    redo = await store.backfill("daily", start, end, dry_run=True)
    assert (redo.enqueued, redo.already) == (0, 6)

    fold_start, fold_end = paris_ms(2024, 10, 27, 1), paris_ms(2024, 10, 27, 4)
    folded = await store.backfill("halves", fold_start, fold_end)
    walked = walk(halves, fold_start, fold_end)
    assert list(folded.fires) == walked and folded.enqueued == len(walked)
    assert len(walked) == 8  # four real hours: 02:00 and 02:30 come twice
    assert walked == list(range(fold_start, fold_end, 30 * MINUTE))
    lines = [line for line in log_lines() if line["event"] == "backfilled"]
    assert [(x["task_id"], x["fires"], x["enqueued"]) for x in lines] == [
        ("daily", 6, 6), ("daily", 6, 0), ("halves", 8, 8),
    ]  # fmt: skip
    assert lines[0]["start_ms"] == start and lines[0]["end_ms"] == end


async def test_an_interval_backfill_stays_on_the_tasks_grid_and_within_its_bounds(
    store: TaskStore,
) -> None:
    now = await store.now_ms()
    begins = now - 10 * MINUTE + 1234
    await make(store, "bounded", Schedule("interval", every_s=60, start_ms=begins))
    await make(store, "free", Schedule("interval", every_s=60))
    # No poller runs here: an active task's grid times from its first on would be the
    # live schedule's (test_a_backfill_leaves_the_live_schedule_its_times); paused, the
    # window is the backfill's.
    for task_id in ("bounded", "free"):
        await store.pause(task_id)
    done = await store.backfill("bounded", now - HOUR, now)
    assert done.fires == tuple(walk(Schedule("interval", every_s=60), begins, now))
    assert done.fires[0] == begins and len(done.fires) == 10  # nothing before start_ms

    # No start: the grid runs through the task's next grid time, back before its creation.
    free = await store.get("free")
    assert free is not None and free.next_run_ms is not None
    window = await store.backfill("free", now - HOUR, now)
    assert len(window.fires) == 60
    assert {(due - free.next_run_ms) % MINUTE for due in window.fires} == {0}

    ended = Schedule("interval", every_s=60, start_ms=begins, end_ms=begins + 3 * MINUTE)
    await make(store, "ended", ended)
    await store.pause("ended")
    assert (await store.backfill("ended", now - HOUR, now)).fires == tuple(
        begins + k * MINUTE for k in range(4)
    )  # end_ms is the schedule's last possible grid time
    await make(store, "once", Schedule("once", at_ms=begins))
    await store.pause("once")
    assert (await store.backfill("once", now - HOUR, now)).fires == (begins,)
    assert (await store.backfill("once", begins + 1, now)).fires == ()


async def test_a_finished_interval_task_is_backfilled_on_the_grid_it_fired_on(
    store: TaskStore, redis_url: str, namespace: str, tmp_path: Path
) -> None:
    """A finished task keeps no next grid time: its grid is found through its history (its
    latest grid occurrence), not its creation time, which an update that placed the grid
    anew (or the create's own round trip) leaves off it. Backfilled on the creation time,
    every fire got a time the task never fired at, its schedule_id none of the originals'."""
    await store.create(TaskSpec("work", Schedule("interval", every_s=60), {"sleep_s": 0}, "p"))
    await trio.sleep(0.05)
    await store.update("p", schedule=Schedule("interval", every_s=60, max_runs=1))
    placed = (await store.get("p")).next_run_ms  # type: ignore[union-attr]
    assert placed is not None
    consumers = {"work": ConsumerSection("tests.handlers.jobs:sleepy", concurrency=50)}
    keys = await store.keys()
    ring_key = keys.history(keys.partition_of("p"))

    async def backfilled_in_history() -> int:
        raw = await store.client.execute("HGET", ring_key, "p")
        return sum(o.origin == "backfill" for o in decode_ring(raw or b""))

    async with running_node(node_config(redis_url, namespace, tmp_path, consumers)):

        async def finished_and_run() -> bool:
            task = await store.get("p")
            return task is not None and task.status == "finished" and task.last_fate == "ok"

        await wait_until(finished_and_run)
        window = (placed - 24 * MINUTE, await store.now_ms())
        done = await store.backfill("p", *window)
        assert done.fires == tuple(placed - k * MINUTE for k in range(24, -1, -1))
        # The backfilled runs fill the history's 20 entries: none of the grid's is left.
        await wait_until(lambda: _at_least(backfilled_in_history, DEFAULT_HISTORY))
    again = await store.backfill("p", *window)
    assert (again.fires, again.enqueued, again.already) == (done.fires, 0, 25)


async def test_a_backfilled_time_runs_again_with_the_consumers_dedupe_window_on(
    store: TaskStore, redis_url: str, namespace: str, tmp_path: Path, record: Path
) -> None:
    """With ``[consumers.<type>] dedupe_window_s`` on, the backfilled copy of a time that
    ran within the window has the same fire key as its first run: it runs again (the
    first run's marker removed with the append), and once."""
    section = ConsumerSection("tests.handlers.jobs:noop", dedupe_window_s=600)
    start = await store.now_ms() + 500
    every = Schedule("interval", every_s=0.5, start_ms=start, misfire="fire_all")  # no gaps
    await make(store, "again", every, "work")

    def ran() -> list[int]:
        return [r["due_ms"] for r in records(record) if r["task_id"] == "again"]

    async def all_appended_ran() -> bool:
        task = await store.get("again")
        return task is not None and len(ran()) == task.fires

    async with running_node(node_config(redis_url, namespace, tmp_path, {"work": section})):
        await wait_until(lambda: _true(len(ran()) >= 2))
        await store.pause("again")
        await wait_until(all_appended_ran)  # none appended before the pause still to run
        dues = sorted(set(ran()))
        done = await store.backfill("again", dues[0], dues[-1] + 1)
        assert done.fires == tuple(dues) and done.enqueued == len(dues)
        await wait_until(lambda: _true(sorted(ran()) == sorted(dues * 2)))
        await trio.sleep(0.5)  # nothing more: each backfilled time once
    assert sorted(ran()) == sorted(dues * 2)


async def test_a_held_backfilled_time_runs_again_with_the_consumers_dedupe_window_on(
    store: TaskStore, redis_url: str, namespace: str, tmp_path: Path, record: Path
) -> None:
    """The same, for a time the task's overlap policy holds back behind its fire in
    flight: appended by its poller later, it runs then (its first run's marker removed
    when the backfill held it)."""
    section = ConsumerSection("tests.handlers.jobs:sleepy", dedupe_window_s=600)
    start = await store.now_ms() + 500
    schedule = Schedule("interval", every_s=1, start_ms=start, overlap="buffer_one")
    await make(store, "held", schedule, "work")
    await store.update("held", payload={"sleep_s": 1.5})

    def said(event: str) -> list[int]:
        return [
            r["due_ms"] for r in records(record) if (r["task_id"], r["event"]) == ("held", event)
        ]

    def ran() -> list[int]:
        return said("ran")

    def running_after_the_first() -> bool:  # a later fire in flight: what the time waits for
        done = ran()
        return bool(done) and any(d > done[0] and d not in done for d in said("started"))

    async with running_node(node_config(redis_url, namespace, tmp_path, {"work": section})):
        await wait_until(lambda: _true(running_after_the_first()))
        first = ran()[0]
        done = await store.backfill("held", first, first + 1)
        assert (done.fires, done.enqueued, done.held_back) == ((first,), 0, 1)
        await wait_until(lambda: _true(ran().count(first) == 2))


async def _true(value: bool) -> bool:
    return value


async def _at_least(count: Callable[[], Any], least: int) -> bool:
    return bool(await count() >= least)


async def test_refusals_write_nothing(store: TaskStore) -> None:
    now = await store.now_ms()
    await make(store, "tick", Schedule("interval", every_s=1))
    cases: list[tuple[dict[str, Any], type[Exception], str]] = [
        ({"start_ms": now - HOUR, "end_ms": now + HOUR}, InvalidTask, "end_ms: must not be in"),
        ({"start_ms": now - HOUR, "end_ms": now - HOUR}, InvalidTask, "end_ms: must be after"),
        ({"start_ms": -1, "end_ms": now}, InvalidTask, "start_ms"),
        ({"start_ms": now - DAY, "end_ms": now}, InvalidTask, "86400 fires"),
        ({"start_ms": now - HOUR, "end_ms": now, "overlap": "some"}, InvalidTask, "overlap"),
    ]
    for options, error, text in cases:
        with pytest.raises(error, match=text):
            await store.backfill("tick", **options)
    with pytest.raises(InvalidTask, match="more than the 10 one backfill"):
        await store.backfill("tick", now - 11_000, now, max_fires=10)
    with pytest.raises(TaskNotFound):
        await store.backfill("nobody", now - HOUR, now)
    await store.stop("tick")
    with pytest.raises(InvalidTransition):
        await store.backfill("tick", now - HOUR, now)
    keys = await store.keys()
    assert not await store.client.execute("EXISTS", keys.queue("report"))
    assert not await store.client.execute("EXISTS", keys.backfilled("report", "tick"))


async def test_a_large_backfill_goes_in_chunks_and_a_type_backfill_covers_its_live_tasks(
    store: TaskStore,
) -> None:
    now = await store.now_ms()
    start = now - now % HOUR - HOUR
    # No start: each grid runs through the task's next fire (at its creation, now), back
    # over the window; with a start in the past they would be overdue, the live
    # schedule's (test_a_backfill_leaves_the_live_schedule_its_times).
    for task_id in ("a", "b", "c", "d"):
        await make(store, task_id, Schedule("interval", every_s=1), "sweep")
    await make(store, "other", Schedule("interval", every_s=1), "elsewhere")
    await store.pause("b")
    await store.stop("c")
    # 1,200 fires: three script calls of up to 500, paced (here: barely).
    one = await store.backfill("a", start, start + 1200 * 1000, rate=1_000_000)
    assert one.enqueued == 1200 and len(await stream(store, "sweep")) == 1200

    with pytest.raises(InvalidTask, match="more than 2000 fires of the tasks of type 'sweep'"):
        await store.backfill_type("sweep", start, start + 1001 * 1000, max_fires=2000)
    dry = await store.backfill_type("sweep", start, start + 1300 * 1000, dry_run=True)
    assert [(b.task_id, len(b.fires), b.enqueued, b.already) for b in sorted(dry, key=id_of)] == [
        ("a", 1300, 0, 1200), ("b", 1300, 0, 0), ("d", 1300, 0, 0),
    ]  # fmt: skip
    done = await store.backfill_type("sweep", start, start + 1300 * 1000, rate=1_000_000)
    assert [(b.task_id, b.enqueued, b.already) for b in sorted(done, key=id_of)] == [
        ("a", 100, 1200), ("b", 1300, 0), ("d", 1300, 0),
    ]  # fmt: skip
    messages = await stream(store, "sweep")
    assert len(messages) == 1200 + 100 + 2600
    assert len({m.schedule_id for m in messages}) == len(messages)
    assert not await stream(store, "elsewhere")
    assert await store.backfill_type("nothing", start, start + 1000) == []


def id_of(backfill: Any) -> str:
    return str(backfill.task_id)


async def test_a_namespace_with_full_messages_gets_full_backfill_messages(
    redis_client: RedisClient, namespace: str
) -> None:
    # A namespace an older version made: its meta has no ``messages`` field.
    await redis_client.execute("HSET", f"{namespace}:meta", "layout", LAYOUT_VERSION)
    store = TaskStore(redis_client, namespace, default_partitions=4)
    assert not (await store.keys()).compact_messages
    now = await store.now_ms()
    await make(store, "full", Schedule("interval", every_s=60))
    done = await store.backfill("full", now - HOUR, now)
    keys: Keys = await store.keys()
    entries = await redis_client.execute("XRANGE", keys.queue("report"), "-", "+")
    fields = [flat_fields(f) for _, f in entries]
    assert [f[b"schedule_id"].decode() for f in fields] == [f"full:{d}" for d in done.fires]
    assert {f[b"type"] for f in fields} == {b"report"}
    assert all(int(f[b"enq_ms"]) >= now for f in fields)


async def test_a_backfill_action_applied_by_a_node_without_the_api_enqueues_its_whole_window(
    store: TaskStore,
) -> None:
    """The API node checked the action's fires against its own ``[api]
    backfill_max_fires``; any node's resumer may apply it, one without ``[api]`` too (a
    poller or consumer node, default bounds): it enqueues every grid time of the window,
    never a cut-off first part of it."""
    from actors.store.actions import ActionSpec, create_action
    from actors.store.apply_actions import ActionSettings, apply_action
    from actors.store.selection import Selector

    now = await store.now_ms()
    start = now - 12_000_000  # 11,000 grid times of a task every second, in the past
    await make(store, "busy", Schedule("interval", every_s=1), "dense")
    spec = ActionSpec("backfill", Selector.from_dict({"ids": ["busy"]}), start_ms=start,
                      end_ms=start + 11_000_000)  # fmt: skip
    assert await create_action(store, "bf", spec, None, "api-node", 60_000) is None
    settings = ActionSettings(backfill_rate=1_000_000)  # a node without [api], unpaced
    done = await apply_action(store, "bf", "api-node", settings)
    assert done.counts()["changed"] == 1
    dues = [m.due_ms for m in await stream(store, "dense")]
    assert len(dues) == len(set(dues)) == 11_000 and dues == sorted(dues)


async def test_a_backfill_leaves_the_live_schedule_its_times(store: TaskStore) -> None:
    """An active task's poller enqueues its next fire and, of the times overdue (its
    poller behind, or down), what its misfire policy fires: a backfill leaves those to it
    (each grid time enqueued once, not by both) and appends the ones the policy coalesces
    or skips, which nothing else would run."""
    now = await store.now_ms()
    begins = now - 10 * MINUTE - 30_000  # 11 grid times due, the last 30 s ago
    policies: list[tuple[str, Misfire]] = [("coalesced", "coalesce"), ("all", "fire_all")]
    for task_id, misfire in policies:
        schedule = Schedule("interval", every_s=60, start_ms=begins, misfire=misfire)
        await make(store, task_id, schedule)
        task = await store.get(task_id)
        assert task is not None and task.next_run_ms == begins  # overdue: no poller here
    grid = [begins + k * MINUTE for k in range(11)]
    coalesced = await store.backfill("coalesced", now - HOUR, now)
    assert coalesced.fires == tuple(grid[:10])  # the poller fires the last one itself
    assert (await store.backfill("all", now - HOUR, now)).fires == ()  # it fires them all
    await store.pause("all")  # paused: its past grid is nobody's but the backfill's
    assert (await store.backfill("all", now - HOUR, now)).fires == tuple(grid)
    # fire_all with a 2-minute catch-up window: the poller runs the last two, and the
    # window expires the rest, which only the backfill runs.
    windowed = Schedule("interval", every_s=60, start_ms=begins, misfire="fire_all",
                        catchup_window_s=120)  # fmt: skip
    await make(store, "windowed", windowed)
    assert (await store.backfill("windowed", now - HOUR, now)).fires == tuple(grid[:9])


async def test_a_task_created_again_under_its_id_is_backfilled_afresh(store: TaskStore) -> None:
    """The backfill markers live in the stream's slot, which a delete cannot reach: a task
    deleted and created again under the same id finds the earlier task's markers, and
    must not take them for its own (its window answered 'already backfilled', nothing
    enqueued, for a week)."""
    now = await store.now_ms()
    grid = Schedule("interval", every_s=60, start_ms=now - now % MINUTE - 2 * HOUR)
    await make(store, "again", grid)  # the same grid both times: the same grid times
    await store.pause("again")
    first = await store.backfill("again", now - HOUR, now - 1)
    assert first.enqueued == len(first.fires) == 60
    await store.delete("again")
    await make(store, "again", grid)
    await store.pause("again")
    dry = await store.backfill("again", now - HOUR, now - 1, dry_run=True)
    assert dry.already == 0
    second = await store.backfill("again", now - HOUR, now - 1)
    assert (second.enqueued, second.already) == (60, 0)
    assert (await store.backfill("again", now - HOUR, now - 1)).already == 60  # its own, kept


async def test_a_backfill_whose_stream_is_rejected_appends_its_window_once_mended(
    store: TaskStore,
) -> None:
    """A backfill while the type's stream key holds another kind of value (WRONGTYPE)
    fails, and so does its repeat; none of its grid times is taken as backfilled, so the
    repeat once the key is mended appends the whole window, each time once."""
    now = await store.now_ms()
    grid = Schedule("interval", every_s=60, start_ms=now - now % MINUTE - 2 * HOUR)
    await make(store, "rejected", grid)
    await store.pause("rejected")
    keys = await store.keys()
    stream = keys.queue("report")
    await store.client.execute("SET", stream, "not a stream")
    for _ in range(2):
        with pytest.raises(Exception, match="WRONGTYPE"):
            await store.backfill("rejected", now - HOUR, now - 1)
    dry = await store.backfill("rejected", now - HOUR, now - 1, dry_run=True)
    assert (len(dry.fires), dry.already) == (60, 0)
    await store.client.execute("DEL", stream)  # mended
    done = await store.backfill("rejected", now - HOUR, now - 1)
    assert (done.enqueued, done.already) == (60, 0)
    assert sorted(m.due_ms for m in await stream_of(store)) == list(done.fires)
    assert (await store.backfill("rejected", now - HOUR, now - 1)).already == 60


async def stream_of(store: TaskStore) -> list[Message]:
    return await stream(store, "report")


async def test_a_held_backfill_time_handed_back_to_a_repeat_is_appended(
    redis_client: RedisClient, namespace: str
) -> None:
    """A backfill's grid time held back behind the task's fire in flight; that one ends, a
    poller starts the held time and dies before appending it; a repeat of the backfill,
    past the takeover time, is handed it to append again: it is appended (and confirmed
    with a message behind it), never confirmed in flight with none, the task stuck. An
    allow_all backfill of the window then appends none of the times held back."""
    from actors.store.flights import FlightEnd, Planned

    store = TaskStore(redis_client, namespace, default_partitions=1, takeover_ms=0)
    now = await store.now_ms()
    grid = Schedule("interval", every_s=60, start_ms=now - now % MINUTE - 2 * HOUR,
                    overlap="buffer_one")  # fmt: skip
    await make(store, "held", grid)
    await store.pause("held")
    keys, scripts = await store.keys(), await store.scripts()
    sid, _ = await store.trigger("held", "skip")  # a fire in flight ahead
    window = (now - 2 * HOUR, now - 2 * HOUR + 2 * MINUTE)  # two grid times
    first = await store.backfill("held", *window)
    assert (first.enqueued, first.held_back, first.skipped) == (0, 1, 1)  # one waits
    await scripts.end_flights([FlightEnd("held", 0, int(sid.split(":")[1]))])
    p = keys.partition_of("held")
    started = await scripts.decide_overlaps("dead-claim", {p: [Planned("held", "1", [])]})
    (due,) = [d for d, _ in started["held"].run]  # then its poller died, nothing appended
    before = await redis_client.execute("XLEN", keys.queue("report"))
    await store.backfill("held", *window)
    assert await redis_client.execute("XLEN", keys.queue("report")) == before + 1
    assert due in [m.due_ms for m in await stream_of(store)]
    flight = await redis_client.execute("HGET", keys.flights(p), "held")
    assert flight.split(b"|")[0] == str(due).encode() and flight.split(b"|")[4] == b""
    plain = await store.backfill("held", *window, overlap="allow_all")
    # taken: the time held back, and the one the first skipped, held back by the repeat
    assert (plain.enqueued, plain.already) == (0, 2)
    assert await redis_client.execute("XLEN", keys.queue("report")) == before + 1


async def test_a_backfill_tells_the_times_skipped_from_those_held_back_and_decides_none_twice(
    redis_client: RedisClient, namespace: str
) -> None:
    """A backfill under ``buffer_one`` while the task's fire is in flight: its first time
    waits (held back), the later ones are skipped (not run), each counted as such. A
    repeat once the fire ahead has ended decides none of them again: the skipped ones
    would start (and run a window the first call answered as not run)."""
    from actors.store.flights import FlightEnd

    store = TaskStore(redis_client, namespace, default_partitions=1)
    now = await store.now_ms()
    grid = Schedule("interval", every_s=60, start_ms=now - now % MINUTE - 2 * HOUR,
                    overlap="buffer_one")  # fmt: skip
    await make(store, "skips", grid)
    await store.pause("skips")
    sid, _ = await store.trigger("skips", "skip")  # a fire in flight ahead
    window = (now - 2 * HOUR, now - 2 * HOUR + 3 * MINUTE)  # three grid times
    first = await store.backfill("skips", *window)
    assert (first.enqueued, first.held_back, first.skipped, first.already) == (0, 1, 2, 0)
    scripts = await store.scripts()
    await scripts.end_flights([FlightEnd("skips", 0, int(sid.split(":")[1]))])
    again = await store.backfill("skips", *window)
    assert (again.enqueued, again.held_back, again.skipped, again.already) == (0, 0, 0, 3)
    # the trigger's, then the one held back (started by the call: nothing was in flight)
    started = [m.due_ms for m in await stream_of(store)]
    assert started == [int(sid.split(":")[1]), first.fires[0]]


async def test_a_paced_backfill_appends_a_fire_it_decided_before_another_call_takes_it(
    redis_client: RedisClient, namespace: str
) -> None:
    """A type's backfill at a fire every 2 s, of two tasks with an overlap policy: the
    second task's fire is paced before its decision, not between its decision and its
    append. Waiting there, unconfirmed past the takeover time, it was appended again by
    another call that decided meanwhile (a trigger), then by the backfill: run twice."""
    store = TaskStore(redis_client, namespace, default_partitions=1, takeover_ms=1)
    start = await store.now_ms() - DAY
    daily = Schedule("interval", every_s=86_400, start_ms=start, overlap="skip")
    await make(store, "a", daily)
    await make(store, "b", daily)
    (_, second), _ = await store.list_tasks("report", None, None, 10)  # backfilled second
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: store.backfill_type("report", start, start + 1, rate=0.5))
        await trio.sleep(0.25)  # the backfill waits for its second fire's turn
        await store.trigger(second.task_id, "skip")
    copies = [m for m in await stream(store, "report") if m.task_id == second.task_id]
    # the trigger's fire in flight first: the backfilled time is skipped (skip), not
    # appended by both calls
    assert [m.due_ms for m in copies if m.due_ms == start] == []


async def test_a_backfilled_time_whose_own_fire_is_in_flight_is_skipped_not_held(
    redis_client: RedisClient, namespace: str
) -> None:
    """A backfill of the grid time whose fire is in flight (queued, running or waiting for
    a retry): its copy cannot run beside it nor wait behind itself; the backfill says it
    skipped it (a ``not_run`` record), where it said held back, and nothing ever ran."""
    from actors.scheduling.poller import Poller, PollerSettings
    from runtime.logging import get_logger

    store = TaskStore(redis_client, namespace, default_partitions=1)
    now = await store.now_ms()
    due = now - now % MINUTE - MINUTE
    every = Schedule("interval", every_s=60, start_ms=due, overlap="buffer_one")
    await make(store, "busy", every)
    poller = Poller(store, PollerSettings())
    assert (await poller.tick(await store.scripts(), [0], get_logger())).enqueued == 1
    (fire,) = [m.due_ms for m in await stream(store, "report")]  # in flight
    done = await store.backfill("busy", fire, fire + 1)
    assert (done.enqueued, done.held_back, done.skipped) == (0, 0, 1)
    keys = await store.keys()
    not_run = await redis_client.execute("HGET", keys.not_run(0), "busy")
    assert not_run == f"1 overlap {fire} {fire}".encode()
    assert [m.due_ms for m in await stream(store, "report")] == [fire]
