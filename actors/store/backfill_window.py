"""A backfill's window: the grid times of a task in a past window, those its live schedule
will enqueue itself left out, and where a finished interval task's grid was.

The grid comes from the schedule's own functions (``Schedule.first_due`` /
``next_after``, the ones the poller walks), within the schedule's ``start_ms`` /
``end_ms`` bounds; an interval grid is the one through the task's current grid time (its
next fire; a finished task's last one, from its history: ``grid_of``), extended back as
far as the window asks (``actors.store.backfill`` appends them)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from actors.domain.errors import InvalidTask
from actors.domain.misfires import plan_fires
from actors.domain.model import Task
from actors.domain.schedules import MAX_MS
from actors.store.flights import parse_policy, task_policy_code
from actors.store.history import decode_ring

if TYPE_CHECKING:
    from actors.store.tasks import TaskStore


def check_window(start_ms: int, end_ms: int, now_ms: int) -> None:
    """A window a backfill may cover: ``0 <= start_ms < end_ms <= now``, InvalidTask naming
    the field otherwise. ``now`` is a fresh ``TIME``: whether a grid time has come is
    due-ness, which Redis's clock decides (a backfill never fires early)."""
    if not 0 <= start_ms <= MAX_MS:
        raise InvalidTask(f"start_ms: must be Unix milliseconds within 0..{MAX_MS}")
    if end_ms <= start_ms:
        raise InvalidTask(f"end_ms: must be after start_ms ({start_ms}), got {end_ms}")
    if end_ms > now_ms:
        raise InvalidTask(
            f"end_ms: must not be in the future (Redis's clock says {now_ms}), got {end_ms}"
        )


def _interval_anchor(task: Task, grid_ms: int | None) -> int:
    """A time on the task's interval grid: its next grid time (the grid the poller walks,
    moved only by a schedule update or a resume with nothing left to fire), else the
    schedule's start, else ``grid_ms`` (a finished task's last grid time: ``grid_of``),
    else the creation time (where a new task's grid starts)."""
    if task.next_run_ms is not None:
        return task.next_run_ms
    if task.schedule.start_ms is not None:
        return task.schedule.start_ms
    return grid_ms if grid_ms is not None else task.created_ms


#: The origins of a history's occurrences on the task's grid (a trigger's are not, nor
#: a replayed one's, whatever it replays).
_ON_GRID = ("schedule", "backfill")


async def grid_of(store: TaskStore, task: Task) -> int | None:
    """Where a finished interval task's grid was, when nothing else says (no next grid
    time: a finished task keeps none; no ``start_ms``): the due time of the latest grid
    occurrence in its history. Its creation time is not on the grid (the grid starts at
    a time read before the create, a few ms earlier), nor after an update placed the grid
    anew: the backfilled fires' schedule_ids would not be the original fires'. The latest
    of its scheduled and backfilled occurrences (a backfill's are on the same grid, and
    may have pushed the scheduled ones out of the ring); None where the task's own record
    says, or its history holds no grid occurrence."""
    return (await grids_of(store, [task])).get(task.task_id)


async def grids_of(store: TaskStore, tasks: Sequence[Task]) -> dict[str, int]:
    """``grid_of`` of each of ``tasks`` that has one, in one round trip."""
    wanted = [
        t for t in tasks
        if t.next_run_ms is None and t.schedule.kind == "interval" and t.schedule.start_ms is None
    ]  # fmt: skip
    if not wanted:
        return {}
    keys = await store.keys()
    rings = await store.client.pipeline(
        [("HGET", keys.history(keys.partition_of(t.task_id)), t.task_id) for t in wanted]
    )
    out: dict[str, int] = {}
    for task, raw in zip(wanted, rings, strict=True):
        ring = decode_ring(raw) if isinstance(raw, bytes) else []  # none, or unreadable
        grid = max((o.due_ms for o in ring if o.origin in _ON_GRID), default=None)
        if grid is not None:
            out[task.task_id] = grid
    return out


def _first(task: Task, start_ms: int, grid_ms: int | None) -> int | None:
    """The task's first grid time at or after ``start_ms`` (and its schedule's start)."""
    schedule = task.schedule
    if schedule.kind == "once":
        at = schedule.first_due(start_ms)
        return at if at is not None and at >= start_ms else None
    low = max(start_ms, schedule.start_ms if schedule.start_ms is not None else start_ms)
    if schedule.kind == "cron":
        return schedule.first_due(low)
    every = schedule.interval_ms()
    anchor = _interval_anchor(task, grid_ms)
    first = anchor - (anchor - low) // every * every  # the first at or after low (exact)
    if first > MAX_MS or (schedule.end_ms is not None and first > schedule.end_ms):
        return None
    return first


def window_fires(
    task: Task, start_ms: int, end_ms: int, limit: int, now_ms: int, grid_ms: int | None = None
) -> list[int]:
    """The task's grid times in ``[start_ms, end_ms)``, in order: at most ``limit + 1`` of
    them (one more than ``limit`` says the window holds more). Those an active task's live
    schedule will enqueue itself are left out (``_live``), so no grid time is enqueued by
    both; ``now_ms``: Redis's clock; ``grid_ms``: ``grid_of``."""
    live, live_from = _live(task, now_ms)
    if live_from is not None:
        end_ms = min(end_ms, live_from)
    out: list[int] = []
    due = _first(task, start_ms, grid_ms)
    while due is not None and due < end_ms and len(out) <= limit:
        if due not in live:
            out.append(due)
        due = task.schedule.next_after(due)
    return out


def _live(task: Task, now_ms: int) -> tuple[set[int], int | None]:
    """The grid times of an active task that its poller will enqueue: those a claim now
    would (its next fire, or under its misfire policy what it makes of the times overdue,
    however its spread places them), and every one from the next grid time after them on.
    The overdue times the policy coalesces or skips, and those its catch-up window would
    expire, are not among them: a backfill is how they run. Judged now: a claim later may
    decide otherwise (docs/API.md). (set of times, the first of the rest, None when
    nothing is live)."""
    schedule, due = task.schedule, task.next_run_ms
    if task.status != "active" or due is None:
        return set(), None
    if due > now_ms:
        return set(), due
    plan = plan_fires(schedule, due, now_ms, task.fires, slack_ms=schedule.slack_ms(task.task_id))
    live = set(plan.fires)
    if schedule.catchup_window_s is not None:  # what the window expires never runs
        policy = parse_policy(task_policy_code(schedule, task.task_id))
        live = {d for d in live if not policy.expired(d, now_ms)}
    return live, plan.next_ms


def count_text(task: Task, start_ms: int, end_ms: int, limit: int, grid_ms: int | None) -> str:
    """How many fires the window holds, for a refusal: exact for an interval, a floor for
    a cron schedule (counting a minutely cron over years would take long)."""
    schedule = task.schedule
    first = _first(task, start_ms, grid_ms)
    if schedule.kind != "interval" or first is None:
        return f"more than {limit}"
    last = end_ms - 1 if schedule.end_ms is None else min(end_ms - 1, schedule.end_ms)
    return str((last - first) // schedule.interval_ms() + 1)
