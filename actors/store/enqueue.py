"""Appending fires to their type's stream, with their lifecycle lines: shared by the
poller, the retry dispatcher and a manual trigger.

Duplicates are stopped here, at the source: ``enqueue.lua`` records, per claim and call,
which fires it appended (one marker hash per claim token, in the stream's own slot, kept
``dedupe_window_ms``), so appending and remembering are one atomic step. A poller that died
after appending and before committing leaves its claim in the tasks' state; the claim that
takes over names it (``Fire.prior``), and the fires the dead one appended are dropped here
(``duplicate_dropped``) instead of running twice. Nothing is written per fire: one marker
a call. The window must outlast the claim lease. A claim its poller committed in full can
be no one's prior, so the poller has its markers deleted in its next enqueue
(``committed``) instead of keeping every fire of the window.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from actors.store.keys import schedule_id
from actors.store.replies import Commit, Fire, FireCommit
from actors.store.scripts import Scripts
from runtime.logging import debug_enabled, emit_events, notify_observers
from runtime.redis_replies import PartRejected


async def enqueue_fires(
    scripts: Scripts,
    fires: Sequence[Fire],
    now_ms: int,
    actor: str,
    dedupe_window_ms: int,
    token: str = "",
    committed: Mapping[str, Sequence[str]] | None = None,
    dropped: list[Fire] | None = None,
) -> int:
    """XADD every fire its prior claim (``Fire.prior``) had not appended, log ``queued``
    (debug) or ``duplicate_dropped`` for each, and return how many were appended.
    ``token``: the claim these fires come from (needed when ``dedupe_window_ms`` > 0);
    ``committed``: the caller's earlier claims whose markers may go (``Scripts.enqueue``).
    Raises if any call failed: the caller must not commit. ``dropped`` gets the fires
    dropped as duplicates."""
    flags = await scripts.enqueue(fires, now_ms, dedupe_window_ms, token, committed)
    return _report(fires, flags, now_ms, actor, dropped)


async def enqueue_and_commit_fires(
    scripts: Scripts,
    fires: Sequence[Fire],
    now_ms: int,
    actor: str,
    dedupe_window_ms: int,
    token: str,
    committed: Mapping[str, Sequence[str]] | None,
    poller: str,
    commits: dict[int, list[FireCommit]],
    writes: Mapping[int, int],
    dropped: list[Fire] | None = None,
) -> tuple[dict[int, Commit], list[PartRejected]]:
    """``enqueue_fires``, then commit the claim's partitions (``Scripts.commit_fires``):
    one round trip on a single server (``Scripts.enqueue_and_commit``). Raises if an
    enqueue failed, and then nothing was committed; a partition whose commit Redis
    rejected is returned apart (its fires appended, its grid where it was)."""
    flags, done, rejected = await scripts.enqueue_and_commit(
        fires, now_ms, dedupe_window_ms, token, committed, poller, commits, writes
    )
    _report(fires, flags, now_ms, actor, dropped)
    return done, rejected


def _report(
    fires: Sequence[Fire], flags: Sequence[bool], now_ms: int, actor: str,
    dropped_fires: list[Fire] | None = None,
) -> int:  # fmt: skip
    """Log ``queued`` (debug) or ``duplicate_dropped`` for each fire, count the rest for
    observers, add the dropped ones to ``dropped_fires``; return how many were appended."""
    # ``queued`` is a debug line (every fire's one info line is written when it ends, with
    # its queued time); when it is not written, observers (metrics) get one count a type
    # instead of a line's fields built for every fire. A dropped duplicate is an info line.
    debug = debug_enabled()
    queued: list[tuple[str, dict[str, Any]]] = []
    dropped: list[tuple[str, dict[str, Any]]] = []
    counts: dict[str, Counter[str]] = defaultdict(Counter)
    for fire, flag in zip(fires, flags, strict=True):
        if flag and not debug:
            counts[fire.type]["retry" if fire.attempt else "first"] += 1
            continue
        if not flag and dropped_fires is not None:
            dropped_fires.append(fire)
        (queued if flag else dropped).append(
            (
                "queued" if flag else "duplicate_dropped",
                {
                    "task_id": fire.task_id,
                    "schedule_id": schedule_id(fire.task_id, fire.due_ms),
                    "type": fire.type,
                    "attempt": fire.attempt,
                    "due_ms": fire.due_ms,
                    "enqueue_lag_ms": now_ms - fire.due_ms,
                },
            )
        )
    if queued:
        emit_events(actor, queued, level="debug")
    if counts:
        notify_observers(
            actor, [("fires_queued", {"type": t, **by_attempt}) for t, by_attempt in counts.items()]
        )
    if dropped:
        emit_events(actor, dropped)
    return len(fires) - len(dropped)
