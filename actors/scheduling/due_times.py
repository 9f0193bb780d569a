"""When each of a poller's partitions is next due, as its last claim or commit saw it.

A poller claims a partition only when something there may be due, and sleeps until the
earliest due time over all it wants: at a few fires a second a partition, most rounds
then skip most partitions, which is less Redis work a fire. What it knows goes stale:
a task created since is not in it, so a partition not looked at for ``max_tick_s`` is
claimed anyway. Times are on Redis's clock, carried forward on trio's.
"""

from __future__ import annotations

import attrs
import trio

from actors.scheduling.claim_loop import TickResult


class DueTimes:
    """Per partition claimed: its earliest due time then (None: nothing scheduled),
    Redis's clock then, and trio's clock then."""

    def __init__(self, max_tick_s: float) -> None:
        self.max_tick_s = max_tick_s
        self._known: dict[int, tuple[int | None, int, float]] = {}

    def seen(self, partition: int, earliest_ms: int | None, redis_ms: int, at: float) -> None:
        """A claim or commit of ``partition`` at ``redis_ms`` (trio's clock ``at``) left its
        earliest due time at ``earliest_ms``."""
        self._known[partition] = (earliest_ms, redis_ms, at)

    def forget(self, partition: int) -> None:
        """Nothing known of ``partition``: claimed in the next round (or no longer wanted)."""
        self._known.pop(partition, None)

    def may_be_due(self, partition: int, now: float) -> bool:
        """Whether a round claims ``partition``: unknown, known due by now, or not looked at
        for ``max_tick_s`` (a task created since may be due)."""
        known = self._known.get(partition)
        if known is None:
            return True
        earliest_ms, redis_ms, at = known
        if now - at >= self.max_tick_s:
            return True
        return earliest_ms is not None and earliest_ms <= redis_ms + (now - at) * 1000

    def with_earliest(self, result: TickResult, partitions: list[int]) -> TickResult:
        """A round's result with the earliest due time over every one of ``partitions``, on
        Redis's clock estimated to now: the sleep until the next round follows it."""
        now = trio.current_time()
        known = [self._known[p] for p in partitions if p in self._known]
        if not known:
            return result
        now_ms = max(int(redis_ms + (now - at) * 1000) for _, redis_ms, at in known)
        times = [e for e, _, _ in known if e is not None]
        return attrs.evolve(result, now_ms=now_ms, earliest_ms=min(times) if times else None)
