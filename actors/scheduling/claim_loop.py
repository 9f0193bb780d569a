"""What the poller and the retry dispatcher share: both tick over a share of the
partitions (claim due entries, enqueue them, commit), and sleep until the earliest due
time they saw."""

from __future__ import annotations

from collections.abc import Iterable

import attrs

from actors.store.flights import DEFAULT_CLAIM_LEASE_MS


@attrs.frozen
class ClaimLoopSettings:
    """Settings of a claim loop over partitions (built from the config in ``actors.app``)."""

    index: int = 0
    of: int = 1
    batch_size: int = 1000
    max_tick_s: float = 0.25
    min_tick_s: float = 0.02
    max_batch_delay_s: float = 0.01
    """The most the pause between ticks may add to a fire's lateness (``[scheduler]
    max_batch_delay_ms``): it caps the shortest pause."""
    claim_lease_ms: int = DEFAULT_CLAIM_LEASE_MS
    dedupe_window_ms: int = 60_000


@attrs.frozen
class TickResult:
    enqueued: int
    now_ms: int
    earliest_ms: int | None
    full: bool
    """Some partition returned a full batch: more may be due right now."""


def partitions_for(index: int, of: int, partitions: int) -> list[int]:
    """The partitions actor ``index`` of ``of`` serves: p with p % of == index."""
    return [p for p in range(partitions) if p % of == index]


def sleep_s(result: TickResult, max_tick_s: float, min_tick_s: float = 0.0) -> float:
    """Until the earliest due time seen, within [min_tick_s, max_tick_s]; 0 if a batch was
    full (more is due now)."""
    if result.full:
        return 0.0
    if result.earliest_ms is None:
        return max_tick_s
    wait_s = (result.earliest_ms - result.now_ms) / 1000
    return min(max_tick_s, max(min_tick_s, wait_s))


#: Most fires a tick gathers at the shortest pause (bounds the lag the pause adds at high
#: rates; with several pollers, their ticks together): above ``TICK_FIRES / min_tick_s``
#: fires a second of the namespace (10,000 at a 20 ms pause) the pause shrinks so a
#: tick gathers this many. Measured on 2 cores (``bench fire``, docs/PERFORMANCE.md):
#: at 20,000 fires/s 10 ms kept p99 start lag at 54 ms, 20 ms took it to 89.
TICK_FIRES = 200.0


def paced_pause_s(min_tick_s: float, max_batch_delay_s: float, fires_per_s: float) -> float:
    """The shortest pause after a tick: ``shortest_pause_s`` within the lag budget. A fire
    that comes due while the loop pauses waits at most this long for the next tick, so
    the budget bounds what pacing adds to any fire's lateness, whatever ``min_tick_s``
    would save in CPU."""
    return min(max_batch_delay_s, shortest_pause_s(min_tick_s, fires_per_s))


def shortest_pause_s(min_tick_s: float, fires_per_s: float) -> float:
    """The pause after a tick that found nothing more due: ``min_tick_s`` while a tick
    gathers at most ``TICK_FIRES``, then shorter in proportion to the rate. With 20 ms
    (``min_tick_s``'s default; the lag budget, ``paced_pause_s``, caps it at 10 ms by
    default): 20 ms up to 10,000 fires a second, 10 ms at 20,000/s, 5 ms at 40,000/s.
    Below that rate a tick costs the node about the same CPU whatever it carries (two
    round trips and the consumer's read and flush after it), so the pause, not the rate,
    sets the CPU: at 1,000 fires/s 20 ms took the node from 58 to 29 % of a core against 5
    ms, Redis from 14 to 9 %, p99 start lag 18 -> 34 ms (``bench fire``, docs/PERFORMANCE.md)."""
    if fires_per_s * min_tick_s <= TICK_FIRES:
        return min_tick_s
    return TICK_FIRES / fires_per_s


class RateMeter:
    """Fires a second, measured over windows of at least ``window_s``."""

    def __init__(self, window_s: float = 1.0) -> None:
        self.window_s = window_s
        self.rate = 0.0
        """The last full window's rate (0 until one has passed)."""
        self._start: float | None = None
        self._count = 0

    def add(self, fires: int, now: float) -> None:
        if self._start is None:
            self._start = now
        self._count += fires
        elapsed = now - self._start
        if elapsed >= self.window_s:
            self.rate = self._count / elapsed
            self._start, self._count = now, 0


def earliest(times: list[int | None]) -> int | None:
    known = [t for t in times if t is not None]
    return min(known) if known else None


class CommittedClaims:
    """A claim loop's claims committed in full, by the types whose streams hold their
    enqueue markers: no later claim can name them as prior, so the loop's next enqueue into
    each type deletes their markers (``Scripts.enqueue``'s ``committed``) instead of letting
    them hold every fire for the whole dedupe window. At most one claim a type waits: the
    next claim with fires of a type takes its predecessor's along."""

    #: Types remembered at most (then forgotten: their markers expire with the window).
    MAX_TYPES = 1000

    def __init__(self) -> None:
        self._by_type: dict[str, list[str]] = {}

    def take(self, types: Iterable[str]) -> dict[str, list[str]]:
        """The waiting claims of ``types``, no longer waiting."""
        return {t: self._by_type.pop(t) for t in types if t in self._by_type}

    def add(self, token: str, types: Iterable[str]) -> None:
        """``token``'s claim is committed in full; it enqueued into ``types``."""
        if len(self._by_type) >= self.MAX_TYPES:
            self._by_type.clear()
        for t in types:
            self._by_type.setdefault(t, []).append(token)
