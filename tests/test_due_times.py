"""Which partitions a poller's round claims, and what it sleeps toward (``DueTimes``), on
trio's autojump clock: what the poller knows goes stale after ``max_tick_s`` of trio time,
and Redis's clock is carried forward on trio's. No test really sleeps."""

from __future__ import annotations

import trio
import trio.testing

from actors.scheduling.claim_loop import TickResult
from actors.scheduling.due_times import DueTimes

NOTHING = TickResult(enqueued=0, now_ms=0, earliest_ms=None, full=False)


async def test_a_partition_is_claimed_when_unknown_due_or_stale(
    autojump_clock: trio.testing.MockClock,
) -> None:
    due = DueTimes(max_tick_s=0.25)
    assert due.may_be_due(0, trio.current_time())  # never claimed
    due.seen(0, earliest_ms=10_100, redis_ms=10_000, at=trio.current_time())
    due.seen(1, earliest_ms=None, redis_ms=10_000, at=trio.current_time())
    assert not due.may_be_due(0, trio.current_time())
    await trio.sleep(0.1)  # Redis's clock is at 10,100 now: partition 0 is due
    assert due.may_be_due(0, trio.current_time())
    assert not due.may_be_due(1, trio.current_time())  # nothing scheduled, not stale yet
    await trio.sleep(0.15)  # max_tick_s since it was claimed: a task created since may be due
    assert due.may_be_due(1, trio.current_time())
    due.forget(1)
    assert due.may_be_due(1, trio.current_time())


async def test_the_sleep_follows_the_earliest_due_time_of_the_partitions_wanted(
    autojump_clock: trio.testing.MockClock,
) -> None:
    due = DueTimes(max_tick_s=0.25)
    assert due.with_earliest(NOTHING, [0, 1]) == NOTHING  # nothing known: as the tick said
    due.seen(0, earliest_ms=12_000, redis_ms=10_000, at=trio.current_time())
    due.seen(1, earliest_ms=11_000, redis_ms=10_000, at=trio.current_time())
    due.seen(2, earliest_ms=10_500, redis_ms=10_000, at=trio.current_time())
    await trio.sleep(0.2)
    result = due.with_earliest(NOTHING, [0, 1])  # partition 2 is not wanted
    assert (result.now_ms, result.earliest_ms) == (10_200, 11_000)
    due.seen(1, earliest_ms=None, redis_ms=10_200, at=trio.current_time())
    assert due.with_earliest(NOTHING, [1]).earliest_ms is None
