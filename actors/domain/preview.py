"""Previews: the fires a schedule will run, computed the way the poller computes them.

``upcoming`` replays the poller's steps without Redis: each grid time is claimed when its
index score comes (``Schedule.fire_ms``: the grid time plus the task's spread; the random
jitter is left out, it is drawn per fire), and ``plan_fires`` decides what that claim
enqueues and which grid time comes next, exactly as in ``Poller._tick``. So a preview
shows coalesced or skipped times as the poller would (they are not listed), honours
``end_ms`` and ``max_runs`` (counting the fires already made), and a task whose grid time
has already passed is shown firing at the first claim from ``now_ms``.

``dst_notes`` says where a cron time is not the plain reading of the expression: a wall
time that does not exist (clocks went forward: the fire moved to the first valid minute
after it, or was not made), or one that exists twice (clocks went back: fired on both
sides, or the first time only).
"""

from __future__ import annotations

import datetime as dt
import zoneinfo
from collections.abc import Callable
from typing import Any

import attrs
import cronsim

from actors.domain.cron_hash import is_hashed
from actors.domain.misfires import plan_fires
from actors.domain.schedules import Schedule

#: Most fires one preview lists.
MAX_PREVIEW = 1000
#: Wall-clock times examined between two fires for ones a DST gap removed.
_GAP_SCAN = 240


@attrs.frozen
class PlannedFire:
    due_ms: int
    """The grid time: the fire's ``due_ms`` and ``schedule_id`` (``task_id:due_ms``)."""
    fire_ms: int
    """When a poller enqueues it, jitter aside (grid time + spread, or the first claim
    after ``now_ms`` for a time already due)."""


def upcoming(
    schedule: Schedule,
    next_ms: int | None,
    n: int,
    task_id: str | None,
    *,
    fires_so_far: int = 0,
    now_ms: int | None = None,
    decided_ms: int | None = None,
    expires: Callable[[int, int], bool] | None = None,
) -> list[PlannedFire]:
    """The next ``n`` fires of a task whose next grid time is ``next_ms`` (None: no more),
    with ``fires_so_far`` fires made. ``task_id`` None: the spread is unknown (fire =
    grid time). Stops early where the grid ends. Not listed: a time at or before
    ``decided_ms``, which a claim does not decide again (the time a task is parked on:
    counted already, or no grid time), and one that ``expires(due_ms, claim_ms)``
    (later than the catch-up window: counted, not run)."""
    out: list[PlannedFire] = []
    due, fired = next_ms, fires_so_far
    for _ in range(2 * n + 10):  # a step fires at most once late (coalesce) or not at all
        if due is None or len(out) >= n:
            break
        claim_ms = due if task_id is None else schedule.fire_ms(due, task_id)
        if now_ms is not None:
            claim_ms = max(claim_ms, now_ms)
        plan = plan_fires(schedule, due, claim_ms, fired, slack_ms=schedule.slack_ms(task_id))
        new = [f for f in plan.fires if decided_ms is None or f > decided_ms]
        out += [PlannedFire(f, claim_ms) for f in new if not (expires and expires(f, claim_ms))]
        due, fired = plan.next_ms, fired + len(new)
    return out[:n]


def preview(
    schedule: Schedule, from_ms: int, n: int, task_id: str | None = None
) -> list[PlannedFire]:
    """The first ``n`` fires of a task given ``schedule`` at ``from_ms`` (its first grid
    time is placed as a create places it). ``H`` cron fields need ``task_id``
    (ValueError otherwise), which also gives the spread."""
    if task_id is None and schedule.cron is not None and is_hashed(schedule.cron):
        raise ValueError("schedule.cron: H is chosen from the task id: give one to preview it")
    grid = schedule if task_id is None else schedule.for_task(task_id)
    return upcoming(grid, grid.first_due(from_ms), n, task_id, now_ms=from_ms)


def rows(
    schedule: Schedule, fires: list[PlannedFire], after_ms: int | None = None
) -> list[dict[str, Any]]:
    """Fires as the API and CLI show them: Unix ms, ISO 8601 in UTC, the grid time in the
    schedule's zone, and a DST note where one applies (``after_ms``: where the first
    fire's gap scan starts, default just before it)."""
    zone = zoneinfo.ZoneInfo(schedule.tz)
    dues = [f.due_ms for f in fires]
    notes = dst_notes(schedule, dues, after_ms)
    return [
        {
            "due_ms": f.due_ms,
            "due": iso_utc(f.due_ms),
            "local": _local_text(f.due_ms, zone),
            "fire_ms": f.fire_ms,
            "fire": iso_utc(f.fire_ms),
            "note": note,
        }
        for f, note in zip(fires, notes, strict=True)
    ]


def iso_utc(ms: int) -> str:
    """``ms`` as ISO 8601 UTC; the number itself past what a date can say (a fire of
    the last day of year 9999 moved by its spread into year 10000)."""
    try:
        return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat(timespec="milliseconds")
    except (ValueError, OverflowError, OSError):
        return str(ms)


def _local_text(ms: int, zone: zoneinfo.ZoneInfo) -> str:
    try:
        return _local(ms, zone).isoformat(timespec="seconds")
    except (ValueError, OverflowError, OSError):  # as iso_utc
        return str(ms)


def _local(ms: int, zone: zoneinfo.ZoneInfo) -> dt.datetime:
    return dt.datetime.fromtimestamp(ms / 1000, zone)


# -- DST ----------------------------------------------------------------------------------


def dst_notes(schedule: Schedule, dues: list[int], after_ms: int | None = None) -> list[str | None]:
    """For each cron time, what a DST change did to it (None: nothing)."""
    if schedule.kind != "cron" or not dues:
        return [None] * len(dues)
    assert schedule.cron is not None
    zone = zoneinfo.ZoneInfo(schedule.tz)
    out: list[str | None] = []
    prev = after_ms if after_ms is not None else dues[0] - 1
    for due in dues:
        notes = [_gap_note(schedule.cron, zone, prev, due), _fold_note(schedule, zone, due)]
        out.append("; ".join(n for n in notes if n) or None)
        prev = due
    return out


def _gap_note(cron: str, zone: zoneinfo.ZoneInfo, prev_ms: int, due_ms: int) -> str | None:
    """Wall times the expression names between two fires that did not exist."""
    before, local = _local(prev_ms, zone), _local(due_ms, zone)
    if before.utcoffset() == local.utcoffset():
        return None  # no change of offset in between: every wall time existed
    missing = _missing_wall_times(cron, zone, before, local)
    if not missing:
        return None
    names = ", ".join(f"{w:%H:%M}" for w in missing)
    verb = "does" if len(missing) == 1 else "do"
    when = f"{verb} not exist on {missing[0]:%Y-%m-%d} (clocks go forward)"
    if not _matches(cron, local):
        return f"{names} {when}: fires at {local:%H:%M} instead"
    return f"{names} {when}: no fire then"


def _missing_wall_times(
    cron: str, zone: zoneinfo.ZoneInfo, before: dt.datetime, local: dt.datetime
) -> list[dt.datetime]:
    """Wall times (naive) the expression matches after ``before`` and up to ``local`` that
    the zone skipped."""
    start, end = _wall(before), _wall(local)
    found: list[dt.datetime] = []
    for wall in cronsim.CronSim(cron, start.replace(tzinfo=dt.UTC)):
        naive = wall.replace(tzinfo=None)
        if naive > end or len(found) >= _GAP_SCAN:
            break
        real = naive.replace(tzinfo=zone).astimezone(dt.UTC).astimezone(zone)
        if real.replace(tzinfo=None) != naive:
            found.append(naive)
    return found


def _fold_note(schedule: Schedule, zone: zoneinfo.ZoneInfo, due_ms: int) -> str | None:
    """A wall time the zone shows twice: which of the two this fire is."""
    local = _local(due_ms, zone)
    other = local.replace(fold=1 - local.fold)
    if other.utcoffset() == local.utcoffset():
        return None
    clock = f"{local:%H:%M} on {local:%Y-%m-%d}"
    if local.fold:
        return f"{clock} again (UTC{_offset(local)}): the clocks go back, the hour repeats"
    other_ms = int(other.timestamp() * 1000)
    if schedule.next_after(other_ms - 1) == other_ms:
        return f"{clock} occurs twice (clocks go back): fires both times, this is the first"
    return f"{clock} occurs twice (clocks go back): fires the first time only"


def _matches(cron: str, local: dt.datetime) -> bool:
    """Whether the wall time is one the expression names (not one a DST gap moved to)."""
    wall = _wall(local).replace(tzinfo=dt.UTC)
    return next(cronsim.CronSim(cron, wall - dt.timedelta(minutes=1))) == wall


def _wall(local: dt.datetime) -> dt.datetime:
    return local.replace(tzinfo=None, fold=0)


def _offset(local: dt.datetime) -> str:
    return local.isoformat()[-6:]
