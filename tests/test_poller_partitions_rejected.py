"""A partition whose keys Redis rejects holds back its own fires only, against a real Redis."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pytest
import trio
from redis.exceptions import ResponseError

from actors.domain.model import TaskSpec
from actors.domain.schedules import Overlap, Schedule
from actors.scheduling.poller import Poller, PollerSettings
from actors.scheduling.rejections import send_cancels
from actors.store.ledger import task_history
from actors.store.tasks import TaskStore
from runtime.logging import get_logger
from runtime.redis_io import RedisClient
from tests.test_poller import stream_fires
from tests.waiting import eventually

PARTITIONS, BROKEN = 4, 2


@pytest.mark.parametrize("window_ms", [60_000, 0])
@pytest.mark.parametrize("stage", ["claim", "decide", "commit"])
async def test_a_rejected_partition_holds_back_its_own_fires_only(
    redis_client: RedisClient, namespace: str, stage: str, window_ms: int,
    log_lines: Callable[[], list[dict[str, Any]]],
) -> None:  # fmt: skip
    """One partition's key holds a string (WRONGTYPE) where its claim reads (a state
    hash), where its overlap decision reads (its flights) or where its commit writes (the
    history a misfire goes to). The tick fires and commits every other partition's tasks,
    sets that one aside (one ``fires_held_back`` line naming it), tries it again a second
    later (still rejected: no more lines, nothing appended), and once the key is mended its
    tasks fire, ``fires_resumed``; no task fires twice, with or without the dedupe window.
    A commit rejected after its fires were appended is sent again, the same, before the
    partition is claimed again (a claim first would find them due and append them again)."""
    store = TaskStore(redis_client, namespace, default_partitions=PARTITIONS)
    now = await store.now_ms()
    # the commit variant: three periods late, so a misfire's history entry is written
    start = now - 3 * 60_000 - 10 if stage == "commit" else now - 10
    overlap: Overlap = "skip" if stage == "decide" else "allow_all"
    every = Schedule("interval", every_s=60, start_ms=start, overlap=overlap)
    ids = [f"x{i}" for i in range(24)]
    await store.create_many([TaskSpec("t", every, task_id=i) for i in ids])
    keys = await store.keys()
    scripts = await store.scripts()
    broken = [i for i in ids if keys.partition_of(i) == BROKEN]
    fine = [i for i in ids if keys.partition_of(i) != BROKEN]
    assert broken and fine
    key = {
        "claim": keys.states(BROKEN, keys.bucket_of(broken[0])),
        "decide": keys.flights(BROKEN),
        "commit": keys.history(BROKEN),
    }[stage]
    saved = await redis_client.execute("DUMP", key)
    await redis_client.execute("DEL", key)
    await redis_client.execute("SET", key, "not a hash")
    poller = Poller(store, PollerSettings(dedupe_window_ms=window_ms))
    everything = list(range(PARTITIONS))
    with trio.fail_after(30):  # it used to wait for the partition, every other with it
        await poller.tick(scripts, everything, get_logger())
    fires = Counter(f["task_id"] for f in await stream_fires(store, "t"))
    # a commit rejected leaves its partition's fires appended, its grid where it was
    assert set(fires) == set(ids if stage == "commit" else fine)
    assert set(fires.values()) == {1}
    for task in await store.get_many(fine):
        assert task is not None and task.fires == 1 and task.next_run_ms is not None
        assert task.next_run_ms > now
    (line,) = [e for e in log_lines() if e["event"] == "fires_held_back"]
    assert line["partition"] == str(BROKEN) and "WRONGTYPE" in line["error"]
    # set aside: a tick at once leaves it out, and says nothing again
    await poller.tick(scripts, everything, get_logger())
    assert len([e for e in log_lines() if e["event"] == "fires_held_back"]) == 1
    await trio.sleep(1.2)  # tried again after its wait: still rejected, still one line
    await poller.tick(scripts, everything, get_logger())
    assert len([e for e in log_lines() if e["event"] == "fires_held_back"]) == 1
    assert not [e for e in log_lines() if e["event"] == "fires_resumed"]
    fires = Counter(f["task_id"] for f in await stream_fires(store, "t"))
    assert set(fires) == set(ids if stage == "commit" else fine)
    assert set(fires.values()) == {1}
    await redis_client.execute("DEL", key)
    if saved is not None:
        await redis_client.execute("RESTORE", key, 0, saved)

    async def resumed() -> bool:
        await poller.tick(scripts, everything, get_logger())
        return any(e["event"] == "fires_resumed" for e in log_lines())

    await eventually(resumed, poll_s=0.2)
    fires = Counter(f["task_id"] for f in await stream_fires(store, "t"))
    assert set(fires) == set(ids) and set(fires.values()) == {1}  # each once
    for task in await store.get_many(broken):
        assert task is not None and task.next_run_ms is not None and task.next_run_ms > now
    (line,) = [e for e in log_lines() if e["event"] == "fires_resumed"]
    assert line["partition"] == str(BROKEN)
    if stage == "commit":  # the rejected commit was sent again and went through in full
        for task_id in broken:
            fates = [o.fate for o in await task_history(store, task_id)]
            assert fates.count("coalesced") == 1, (task_id, fates)
        inflight = await redis_client.execute("HGET", keys.partition_owner(BROKEN), "inflight")
        assert not inflight  # no claim left uncommitted


async def test_a_stopping_poller_sends_a_rejected_commit_once_more(
    redis_client: RedisClient, namespace: str
) -> None:
    """A partition's commit was rejected (its fires appended) and the key mended before
    its next try: the poller stopping sends that commit once more before it hands the
    partition back, so the next owner finds the grids moved on, not due again."""
    store = TaskStore(redis_client, namespace, default_partitions=PARTITIONS)
    start = await store.now_ms() - 3 * 60_000 - 10  # late: the commit writes a misfire entry
    every = Schedule("interval", every_s=60, start_ms=start)
    ids = [f"x{i}" for i in range(24)]
    await store.create_many([TaskSpec("t", every, task_id=i) for i in ids])
    keys = await store.keys()
    scripts = await store.scripts()
    broken = [i for i in ids if keys.partition_of(i) == BROKEN]
    await redis_client.execute("SET", keys.history(BROKEN), "not a hash")
    poller = Poller(store, PollerSettings())
    await poller.tick(scripts, list(range(PARTITIONS)), get_logger())
    assert await redis_client.execute("HGET", keys.partition_owner(BROKEN), "inflight")
    await redis_client.execute("DEL", keys.history(BROKEN))
    with trio.fail_after(30):
        await poller.leave(scripts, get_logger())
    assert not await redis_client.execute("HGET", keys.partition_owner(BROKEN), "inflight")
    for task_id in broken:
        fates = [o.fate for o in await task_history(store, task_id)]
        assert fates.count("coalesced") == 1, (task_id, fates)


async def test_cancel_requests_go_type_by_type_once_one_is_rejected(
    redis_client: RedisClient, log_lines: Callable[[], list[dict[str, Any]]]
) -> None:
    """Cancel requests of two types in one call, one type's hash rejected: sent again type
    by type, the healthy type's request is written, the other left out with one
    ``cancels_not_sent`` line naming it; a call without a rejection is sent once."""
    sent: list[dict[str, list[str]]] = []

    async def cancel(by_type: Mapping[str, Sequence[str]]) -> None:
        sent.append({t: list(s) for t, s in by_type.items()})
        if "broken" in by_type:
            raise ResponseError("WRONGTYPE Operation against a key holding the wrong kind")

    cancels = {"fine": ["f:1"], "broken": ["b:1", "b:2"]}
    await send_cancels(redis_client, cancel, cancels, "node/scheduler/poller-0")
    assert sent == [cancels, {"fine": ["f:1"]}, {"broken": ["b:1", "b:2"]}]
    (line,) = [e for e in log_lines() if e["event"] == "cancels_not_sent"]
    assert (line["type"], line["fires"]) == ("broken", 2) and "WRONGTYPE" in line["error"]
    sent.clear()
    await send_cancels(redis_client, cancel, {"fine": ["f:2"], "other": ["o:1"]}, "p")
    assert sent == [{"fine": ["f:2"], "other": ["o:1"]}]
