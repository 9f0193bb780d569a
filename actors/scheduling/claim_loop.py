"""What the poller and the retry dispatcher share: both tick over a share of the
partitions (claim due entries, enqueue them, commit), and sleep until the earliest due
time they saw."""

from __future__ import annotations

import attrs


@attrs.frozen
class ClaimLoopSettings:
    """Settings of a claim loop over partitions (built from the config in ``actors.app``)."""

    index: int = 0
    of: int = 1
    batch_size: int = 1000
    max_tick_s: float = 0.25
    min_tick_s: float = 0.005
    claim_lease_ms: int = 10_000
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


def earliest(times: list[int | None]) -> int | None:
    known = [t for t in times if t is not None]
    return min(known) if known else None
