"""Backfill: running the grid times of a past window, for one task or every task of a type.

A backfill appends one message per grid time in ``[start_ms, end_ms)`` to the type's
stream, as the poller would have appended it: attempt 0, ``due_ms`` the grid time, so its
``schedule_id`` (``task_id:due_ms``) is the one the original fire had and a duplicate of
it is recognisable downstream. Which grid times a window holds, and which the live
schedule keeps for itself: ``actors.store.backfill_window``.

Idempotent: ``backfill.lua`` marks each appended grid time in a hash per task
(``Keys.backfilled``, in the stream's slot, kept ``RETENTION_MS`` after the task's last
backfill) and appends only the times it marks new, in one script, so running the same
backfill twice (or two at once) appends each fire once. A backfill is not a replay of what
the poller did: a grid time that already ran runs again, which is what a backfill is for.
A grid time the live schedule will enqueue itself (an active task's next fire and those
after it, or of the times overdue, what its misfire policy fires; placed later by a spread
or not) is left to it; the overdue times the policy coalesces or skips are backfilled.

Bounded: a call covers at most ``[api] backfill_max_fires`` fires (refused whole, before
anything is written, beyond it), appended ``CHUNK`` at a time and paced to ``[api]
backfill_rate`` fires a second, so a large backfill shares the stream and Redis with the
live fires instead of starving them. The request answers once every chunk is in.

The schedule, the task's state and its fire count are left as they are (as a trigger
leaves them); ``max_runs`` does not limit a backfill.
"""

from __future__ import annotations

import typing
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import attrs
import trio

from actors.domain.errors import InvalidTask, InvalidTransition, TaskNotFound
from actors.domain.model import Task, encode_payload
from actors.domain.schedules import Overlap
from actors.store.backfill_window import check_window, count_text, grid_of, window_fires
from actors.store.flights import with_origin
from actors.store.keys import SEEN_ATTEMPTS, schedule_id
from actors.store.labels import say_unreadable
from actors.store.manual_fires import (
    APPENDED,
    DUPLICATE,
    HELD,
    HELD_MARK,
    SKIPPED,
    check_overlap,
    fire_under,
)
from actors.store.queue_rows import stored_number
from actors.store.scripts import ENQUEUE_CHUNK
from runtime.config import check_name
from runtime.logging import emit_events

if TYPE_CHECKING:
    from actors.store.tasks import TaskStore

#: How long a task's backfill markers are kept after its last backfill: the same window
#: backfilled again within it appends nothing; after it, it runs again.
RETENTION_MS = 7 * 86_400_000
#: Grid times per ``backfill.lua`` call: bounds how long one call holds Redis (~1-2 ms).
CHUNK = ENQUEUE_CHUNK
#: Defaults of ``[api] backfill_max_fires`` and ``[api] backfill_rate``.
DEFAULT_MAX_FIRES = 10_000
#: The most ``[api] backfill_max_fires`` may be: what an action checked against its API
#: node's bound is applied, by whichever node, up to this many fires a task.
MOST_FIRES = 1_000_000
DEFAULT_RATE = 5_000.0
#: The statuses whose tasks a by-type backfill covers.
TYPE_STATUSES = ("active", "paused")
#: Tasks per listing page read by a by-type backfill.
_PAGE = 1000
_ACTOR = "store"


@attrs.frozen
class TaskBackfill:
    """What a backfill of one task did (or, dry, would do)."""

    task_id: str
    type: str
    overlap: str
    fires: tuple[int, ...]
    """The window's grid times, in order."""
    enqueued: int
    """Appended by this call (0 for a dry run)."""
    already: int
    """Grid times an earlier backfill appended (not appended again)."""
    held_back: int = 0
    """Grid times the overlap policy held back: waiting behind the task's fire in flight,
    they start once it has ended (a repeat leaves them be)."""
    skipped: int = 0
    """Grid times the overlap policy skipped (a ``not_run`` line each): not run, and
    taken as the rest (a repeat of the backfill, a client's retry or the action's resumer,
    decides nothing twice)."""

    def to_dict(self, start_ms: int, end_ms: int, dry_run: bool) -> dict[str, Any]:
        return {
            "task_id": self.task_id,
            "type": self.type,
            "start_ms": start_ms,
            "end_ms": end_ms,
            "overlap": self.overlap,
            "dry_run": dry_run,
            "fires": [
                {"due_ms": d, "schedule_id": schedule_id(self.task_id, d)} for d in self.fires
            ],
            "enqueued": self.enqueued,
            "already_backfilled": self.already,
            "held_back": self.held_back,
            "skipped": self.skipped,
        }

    def counts(self) -> dict[str, Any]:
        return {
            "task_id": self.task_id,
            "fires": len(self.fires),
            "enqueued": self.enqueued,
            "already_backfilled": self.already,
            "held_back": self.held_back,
            "skipped": self.skipped,
        }


# -- the grid -----------------------------------------------------------------------------


# -- appending ----------------------------------------------------------------------------


class Pacer:
    """Spaces appends to at most ``rate`` fires a second over one backfill call."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self._started: float | None = None
        self._sent = 0

    async def before(self, count: int) -> None:
        """Wait until ``count`` more fires may go (the first chunk goes at once)."""
        if self._started is None:
            self._started = trio.current_time()
        await trio.sleep_until(self._started + self._sent / self.rate)
        self._sent += count


async def append_fires(
    store: TaskStore, task: Task, due_times: Sequence[int], overlap: Overlap, pacer: Pacer
) -> list[str]:
    """Append these grid times of ``task`` to its type's stream, each unless an earlier
    backfill did (``backfill.lua``), ``CHUNK`` a call, paced by ``pacer``, as the overlap
    policy lets them (``manual_fires``); per time, its fate (``APPENDED``, ``DUPLICATE``,
    ``HELD``, ``SKIPPED``). Every backfill append goes through here."""
    # The policy the fires run under (``overlap``: the body's, else the task's own) decides
    # which of them reach the stream now (``manual_fires``): under allow_all, every one.
    scripts = await store.scripts()
    payload = encode_payload(task.payload)

    async def append(dues: Sequence[int], policy: str) -> list[bool]:
        flags: list[bool] = []
        for i in range(0, len(dues), CHUNK):
            chunk = dues[i : i + CHUNK]
            if not policy:  # a policy's decision was paced before it was made (below)
                await pacer.before(len(chunk))
            flags += await scripts.backfill(
                task.type, task.task_id, payload, chunk, await store.now_ms(), RETENTION_MS,
                with_origin(policy, "b"), task.created_ms,
            )  # fmt: skip
        return flags

    await _forget_an_earlier_task(store, task)
    # Looked up under every policy: a time an earlier backfill held back is marked 'h',
    # which append_once appends (a time a decision hands this call), so it must not reach
    # it otherwise.
    taken = await _backfilled(store, task, due_times)
    fresh = [d for d in due_times if d not in taken]
    if fresh and overlap != "allow_all":
        # Paced before the decision, not between it and its append: a fire it puts in
        # flight is unconfirmed until appended, and one left so past the pollers' claim
        # lease is taken as its decider's that died and appended by the task's next claim
        # too. A decision starts at most one fire; the rest wait or are skipped.
        await pacer.before(1)
    fates = await fire_under(
        scripts, task.task_id, task.type, fresh, overlap, append, _ACTOR, store.takeover_ms,
        store.history,
    )  # fmt: skip
    decided = [d for d in fresh if fates[d] in (HELD, SKIPPED)]
    if decided:
        await _mark(store, task, decided)
    return [DUPLICATE if d in taken else fates[d] for d in due_times]


async def count_backfilled(store: TaskStore, task: Task, due_times: Sequence[int]) -> int:
    """How many of these grid times an earlier backfill took (a dry run's answer)."""
    return len(await _backfilled(store, task, due_times))


#: The marker hash's field naming the task it was written for (its ``created_ms``): a task
#: deleted and created again under its id starts with no grid time backfilled (as does one
#: whose marker's field no script wrote: read as an earlier task's).
BORN = "born"


async def _forget_an_earlier_task(store: TaskStore, task: Task) -> None:
    """Delete the task's marker if it was written for an earlier task of the same id
    (deleted since; the marker lives in the stream's slot, which the delete cannot reach)."""
    keys = await store.keys()
    marker = keys.backfilled(task.type, task.task_id)
    born = await store.client.execute("HGET", marker, BORN)
    if born is not None and stored_number(born) != task.created_ms:
        await store.client.execute("DEL", marker)


async def _backfilled(store: TaskStore, task: Task, due_times: Sequence[int]) -> set[int]:
    """The grid times an earlier backfill of this task took: appended, or held back by its
    policy (none if its marker is an earlier task's of the same id)."""
    if not due_times:
        return set()
    keys = await store.keys()
    marker = keys.backfilled(task.type, task.task_id)
    replies = await store.client.reads(
        [("HGET", marker, BORN)]
        + [("HMGET", marker, *due_times[i : i + CHUNK]) for i in range(0, len(due_times), CHUNK)]
    )
    born, replies = replies[0], replies[1:]
    if born is not None and stored_number(born) != task.created_ms:
        return set()
    marked = [value is not None for reply in replies for value in reply]
    return {d for d, m in zip(due_times, marked, strict=True) if m}


async def _mark(store: TaskStore, task: Task, due_times: Sequence[int]) -> None:
    """Mark grid times the overlap policy held back or skipped as taken by this backfill:
    they start when the fire in flight ends, or were decided not to run, and a repeat
    must not decide them again (it could start a time skipped, or under cancel_other
    cancel the one that waited and has started since).
    A time marked appended already (a racing backfill's) keeps its mark (HSETNX).
    The consumers' dedupe markers of their earlier runs go, as ``backfill.lua`` removes
    those of the times it appends: a held time, appended by its poller later, is no
    duplicate of its first run (the keys share the stream's slot)."""
    keys = await store.keys()
    marker = keys.backfilled(task.type, task.task_id)
    seen = keys.seen_prefix(task.type)
    calls: list[tuple[Any, ...]] = [("HSET", marker, BORN, task.created_ms)]
    calls += [("HSETNX", marker, d, HELD_MARK) for d in due_times]
    calls += [
        ("UNLINK", *[f"{seen}{task.task_id}:{d}:{a}" for a in range(SEEN_ATTEMPTS)])
        for d in due_times
    ]
    await store.client.pipeline([*calls, ("PEXPIRE", marker, RETENTION_MS)])


async def _run(
    store: TaskStore, task: Task, fires: list[int], overlap: Overlap, dry_run: bool, pacer: Pacer
) -> TaskBackfill:
    if dry_run:
        already = await count_backfilled(store, task, fires) if fires else 0
        return TaskBackfill(task.task_id, task.type, overlap, tuple(fires), 0, already)
    fates = await append_fires(store, task, fires, overlap, pacer)
    return TaskBackfill(
        task.task_id, task.type, overlap, tuple(fires), fates.count(APPENDED),
        fates.count(DUPLICATE), fates.count(HELD), fates.count(SKIPPED),
    )  # fmt: skip


def _emit(start_ms: int, end_ms: int, done: Sequence[TaskBackfill]) -> None:
    emit_events(
        _ACTOR,
        [
            ("backfilled", {"task_id": b.task_id, "type": b.type, "start_ms": start_ms,
                            "end_ms": end_ms, "fires": len(b.fires), "enqueued": b.enqueued})
            for b in done
        ],
    )  # fmt: skip


# -- the operations -----------------------------------------------------------------------


async def backfill_task(
    store: TaskStore,
    task_id: str,
    start_ms: int,
    end_ms: int,
    *,
    overlap: str | None = None,
    dry_run: bool = False,
    max_fires: int = DEFAULT_MAX_FIRES,
    rate: float = DEFAULT_RATE,
) -> TaskBackfill:
    """Backfill one task's window (``TaskStore.backfill``). A stopped task is refused
    (InvalidTransition), as a trigger is; a paused or finished one is backfilled."""
    if overlap is not None and overlap not in typing.get_args(Overlap):
        allowed = ", ".join(typing.get_args(Overlap))
        raise InvalidTask(f"overlap: must be one of {allowed}, got {overlap!r}")
    now_ms = await store.client.time_ms()
    check_window(start_ms, end_ms, now_ms)
    task = await store.get(task_id)
    if task is None:
        raise TaskNotFound(task_id)
    if task.status == "stopped":
        raise InvalidTransition(f"task {task_id!r} is stopped (for good): it cannot be backfilled")
    grid_ms = await grid_of(store, task)
    fires = window_fires(task, start_ms, end_ms, max_fires, now_ms, grid_ms)
    if len(fires) > max_fires:
        count = count_text(task, start_ms, end_ms, max_fires, grid_ms)
        raise InvalidTask(
            f"end_ms: the window holds {count} fires "
            f"of task {task_id!r}, more than the {max_fires} one backfill may enqueue ([api] "
            "backfill_max_fires): backfill shorter windows"
        )
    policy = typing.cast(Overlap, overlap or task.schedule.overlap)
    check_overlap(task_id, task.schedule.overlap, policy, task.status)
    done = await _run(store, task, fires, policy, dry_run, Pacer(rate))
    if not dry_run:
        _emit(start_ms, end_ms, [done])
    return done


async def backfill_type(
    store: TaskStore,
    task_type: str,
    start_ms: int,
    end_ms: int,
    *,
    dry_run: bool = False,
    max_fires: int = DEFAULT_MAX_FIRES,
    rate: float = DEFAULT_RATE,
) -> list[TaskBackfill]:
    """Backfill the window of every active or paused task of a type, each under its own
    overlap policy (``TaskStore.backfill_type``): the type index is read page by page, all
    the fires are planned first and the call is refused whole if they number more than
    ``max_fires``. The tasks with a grid time in the window, in listing order."""
    check_name("type", task_type)
    now_ms = await store.client.time_ms()
    check_window(start_ms, end_ms, now_ms)
    planned: list[tuple[Task, list[int]]] = []
    total, cursor = 0, None
    while True:
        unreadable: list[tuple[str, str]] = []
        page, cursor = await store.list_tasks(task_type, None, cursor, _PAGE, unreadable=unreadable)
        say_unreadable(unreadable)  # gone past: one broken record holds up no other task
        for task in page:
            if task.status not in TYPE_STATUSES:
                continue
            fires = window_fires(task, start_ms, end_ms, max_fires - total, now_ms)
            total += len(fires)
            if total > max_fires:
                raise InvalidTask(
                    f"end_ms: the window holds more than {max_fires} fires of the tasks of "
                    f"type {task_type!r}, the most one backfill may enqueue ([api] "
                    "backfill_max_fires): backfill shorter windows"
                )
            if fires:
                planned.append((task, fires))
        if cursor is None:
            break
    pacer = Pacer(rate)
    done = [
        await _run(store, task, fires, task.schedule.overlap, dry_run, pacer)
        for task, fires in planned
    ]
    if not dry_run:
        _emit(start_ms, end_ms, done)
    return done
