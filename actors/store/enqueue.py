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

from redis.exceptions import ResponseError

from actors.store.keys import schedule_id
from actors.store.replies import Commit, Fire, FireCommit
from actors.store.scripts import Scripts
from runtime.errors import RedisRefused
from runtime.logging import debug_enabled, emit_events, notify_observers
from runtime.redis_replies import ReplyClass, restarts
from runtime.redis_replies import refused as refused_reply


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
) -> dict[int, Commit]:
    """``enqueue_fires``, then commit the claim's partitions (``Scripts.commit_fires``):
    one round trip on a single server (``Scripts.enqueue_and_commit``). Raises if an
    enqueue failed, and then nothing was committed."""
    flags, done = await scripts.enqueue_and_commit(
        fires, now_ms, dedupe_window_ms, token, committed, poller, commits, writes
    )
    _report(fires, flags, now_ms, actor, dropped)
    return done


async def enqueue_and_commit_each_type(
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
    dropped: list[Fire],
    refused_types: set[str],
) -> dict[int, Commit]:
    """``enqueue_and_commit_fires``; when Redis refuses it, each type's fires are appended
    alone, so that a type whose stream rejects its appends (a key of the wrong type, a
    permission missing) holds up its own tasks only: the other tasks are committed, that
    type's stay due, their claim kept in flight so that what a chunk of theirs appended
    is found (``lost`` in the commit's answer; their partition looked at again after
    ``REFUSED_RETRY_MS``). Writes refused by the server (``OOM``, ``MISCONF``,
    ``NOREPLICAS``) are every type's: raised, for the caller to wait out, as is the
    original refusal when every type's appends went in. ``refused_types``: the types
    refused at their last try, kept up to date; an ``enqueue_refused`` line when one begins
    to be refused, ``enqueue_accepted`` when it is accepted again."""
    types = {f.type for f in fires}
    try:
        done = await enqueue_and_commit_fires(
            scripts, fires, now_ms, actor, dedupe_window_ms, token, committed, poller, commits,
            writes, dropped,
        )  # fmt: skip
    except (RedisRefused, ResponseError) as exc:
        if _not_for_one_type(exc, scripts):
            raise
        refused: dict[str, str] = {}
        for task_type in sorted(types):
            typed = [f for f in fires if f.type == task_type]
            try:
                await enqueue_fires(
                    scripts, typed, now_ms, actor, dedupe_window_ms, token, committed, dropped
                )
            except (RedisRefused, ResponseError) as type_exc:
                if _not_for_one_type(type_exc, scripts):
                    raise
                refused[task_type] = str(type_exc)
        if not refused:
            raise
        held = {f.task_id for f in fires if f.type in refused}
        kept = {p: [c for c in cs if c.task_id not in held] for p, cs in commits.items()}
        back = {p for p, cs in commits.items() if len(kept[p]) < len(cs)}
        done = await scripts.commit_fires(poller, token, kept, writes, back)
        for p in back:  # not committed: as lost (the poller forgets their states)
            ids = [c.task_id for c in commits[p] if c.task_id in held]
            due = max(done[p].earliest_ms or 0, now_ms + REFUSED_RETRY_MS)
            done[p] = Commit(due, [*done[p].lost, *ids])
        _note_refused(refused, types, refused_types, actor)
        return done
    _note_refused({}, types, refused_types, actor)
    return done


#: How long a partition whose tasks a refused type held up is left before its next claim
#: (at most the poller's ``max_tick_s``): a refused append is not sent again in a loop.
REFUSED_RETRY_MS = 1000


def _not_for_one_type(error: RedisRefused | ResponseError, scripts: Scripts) -> bool:
    """Whether a refused append is the server's refusal of every write, or a reply no
    wait mends, rather than something of the type's own stream."""
    if not isinstance(error, RedisRefused):
        if restarts(error):
            return True
        error = refused_reply(error, scripts.client.description)
    return error.kind == ReplyClass.REFUSED_WRITE.value


def _note_refused(
    refused: Mapping[str, str], tried: set[str], refused_types: set[str], actor: str
) -> None:
    began = [t for t in refused if t not in refused_types]
    ended = [t for t in tried if t in refused_types and t not in refused]
    refused_types.difference_update(ended)
    refused_types.update(refused)
    lines: list[tuple[str, dict[str, Any]]] = [
        ("enqueue_refused", {"type": t, "error": refused[t]}) for t in began
    ]
    lines += [("enqueue_accepted", {"type": t}) for t in ended]
    if lines:
        emit_events(actor, lines)


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
