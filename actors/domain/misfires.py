"""The misfire policy: what a claimed task fires now, and where its grid goes next.

A poller claims a task once its grid time has come; by then later grid times may have
come too (no poller ran, a poller died holding it; a paused task's resume goes on from
the next grid time instead: ``paused_past`` counts the ones it skipped).
``plan_fires`` decides, purely from the schedule and Redis's "now", which of those times
fire (``coalesce``, ``skip``, ``fire_all`` capped at ``misfire_cap``; all of them, capped,
for times owed after a poller's crash) and the next grid time. Apart from the grids
themselves (``actors.domain.schedules``) because the poller and the preview replay it
alike, and it is the one place a claim's fires are decided.
"""

from __future__ import annotations

import datetime as dt
import zoneinfo

import attrs
import cronsim

from actors.domain.schedules import Schedule

#: Occurrences examined when counting missed cron fires; beyond it (or a larger
#: ``misfire_cap``), the count is a floor: the walk takes one time more than it keeps, so a
#: grid time left beyond the fires always counts as missed.
_MAX_CRON_SCAN = 1000


@attrs.define  # not frozen: built per fire, and a frozen class costs ~4x to build
class FirePlan:
    """What to do with one claimed task: the fires to enqueue now and the next grid time."""

    fires: tuple[int, ...]
    """Due times (grid, ms) to enqueue now, each its own schedule_id."""
    next_ms: int | None
    """Next grid time, or None when the task is finished."""
    missed: int = 0
    """Grid times that were due but are not fired one by one (coalesced or skipped)."""


def plan_fires(
    schedule: Schedule,
    due_ms: int,
    now_ms: int,
    fires_so_far: int,
    *,
    owed_until_ms: int | None = None,
    owed_from_ms: int | None = None,
    slack_ms: int = 0,
) -> FirePlan:
    """Apply the misfire policy to a task whose grid time ``due_ms`` has come (``<= now_ms``).

    A misfire is when the grid time after ``due_ms`` has come too: the task was not fired
    while it should have been (no poller ran).

    ``owed_until_ms``: a poller claimed ``due_ms`` and died before committing; its claim
    blocked the task until then. The grid times that came due while it did are late only
    because of the crash, not missed while nothing ran, so they are all fired (at most
    ``misfire_cap``); the policy applies to the grid times after it. ``owed_from_ms``: no
    claim of the dead poller blocked a grid time before it (it was alive and claiming
    then, and its claims apply the policy to the times they find missed): a task written
    with grid times further back (created while its partition had no live poller,
    starting in the past) has those under its policy, as if claimed at ``owed_from_ms``,
    and only the times from there on owed.

    ``slack_ms``: how long after its grid time a fire is enqueued by design (the task's
    spread and jitter, ``Schedule.slack_ms``). A grid time has come only once that much
    past it: a claim placed late by the spread is no misfire.
    """
    nxt = schedule.next_after(due_ms)
    if slack_ms:  # at most one grid step: a claim later than that has missed times anyway
        shift = slack_ms if nxt is None else min(slack_ms, nxt - due_ms)
        now_ms -= shift
        if owed_from_ms is not None:  # a time is due there once its slack is past too
            owed_from_ms -= shift
    # The grid ends at end_ms: no time past it was due, however late the claim.
    last_ms = now_ms if schedule.end_ms is None else min(now_ms, schedule.end_ms)
    if nxt is None or nxt > now_ms:
        fires: tuple[int, ...] = (due_ms,)
        missed = 0
        upcoming = nxt
    elif owed_until_ms is not None and owed_from_ms is not None and owed_from_ms > due_ms:
        before = plan_fires(schedule, due_ms, min(owed_from_ms, now_ms), fires_so_far)
        resume = before.next_ms
        if resume is None or resume > now_ms:
            return before
        rest = plan_fires(
            schedule, resume, now_ms, fires_so_far + len(before.fires),
            owed_until_ms=owed_until_ms if resume <= owed_until_ms else None,
        )  # fmt: skip
        return FirePlan(before.fires + rest.fires, rest.next_ms, before.missed + rest.missed)
    elif owed_until_ms is not None:
        until = max(due_ms, min(owed_until_ms, last_ms))
        blocked = _overdue(schedule, due_ms, until, schedule.misfire_cap)  # head and last
        owed = tuple(blocked[: schedule.misfire_cap])
        after = schedule.next_after(blocked[-1])
        if after is None or after > now_ms:
            rest = FirePlan((), after)
        else:
            rest = plan_fires(schedule, after, now_ms, fires_so_far + len(owed))  # slack taken
        fires, upcoming = owed + rest.fires, rest.next_ms
        missed = max(0, _count_overdue(schedule, due_ms, until) - len(owed)) + rest.missed
    else:
        overdue = _overdue(schedule, due_ms, last_ms, schedule.misfire_cap)
        upcoming = schedule.first_after(due_ms, now_ms)
        # a cron's count is the walk's own length (one walk, not two)
        count = (
            _count_overdue(schedule, due_ms, last_ms) if schedule.kind == "interval"
            else len(overdue)
        )  # fmt: skip
        if schedule.misfire == "coalesce":
            # the last of the grid walked forward when the walk reached now (a cron's too:
            # walked back from now, a repeated hour can read as the day before's)
            walked = schedule.kind == "interval" or len(overdue) <= max(
                schedule.misfire_cap, _MAX_CRON_SCAN
            )
            latest = overdue[-1] if walked else _latest_cron(schedule, last_ms)
            fires, missed = (latest,), count - 1
        elif schedule.misfire == "skip":
            fires, missed = (), count
        else:
            fires = tuple(overdue[: schedule.misfire_cap])
            missed = max(0, count - len(fires))
    if schedule.max_runs is not None:
        left = max(0, schedule.max_runs - fires_so_far)
        if len(fires) >= left:
            fires, upcoming = fires[:left], None
            if not left:  # past the end of its grid (a task kept scheduled for fires
                missed = 0  # waiting behind its last one): no time of it was missed
    return FirePlan(fires, upcoming, missed)


def _latest_cron(schedule: Schedule, now_ms: int) -> int:
    """The last cron time at or before ``now_ms`` (the one a coalesced fire stands for):
    walked back from now, then forward along the grid while it stays at or before now
    (walked back from an hour a clock set back repeats, cronsim can land a day early)."""
    assert schedule.cron is not None
    start = dt.datetime.fromtimestamp((now_ms + 1) / 1000, tz=zoneinfo.ZoneInfo(schedule.tz))
    latest = int(next(cronsim.CronSim(schedule.cron, start, reverse=True)).timestamp() * 1000)
    later = schedule.next_after(latest)
    while later is not None and later <= now_ms:
        latest, later = later, schedule.next_after(later)
    return latest


def _overdue(schedule: Schedule, due_ms: int, now_ms: int, cap: int) -> list[int]:
    """Grid times from ``due_ms`` up to ``now_ms``: for an interval the first ``cap`` of
    them and the last; for a cron every one, up to one past ``_MAX_CRON_SCAN`` (or
    ``cap``): a walk cut off says so by its length."""
    if schedule.kind == "interval":
        every = schedule.interval_ms()
        count = (now_ms - due_ms) // every + 1
        head = [due_ms + k * every for k in range(min(cap, count))]
        return [*head, due_ms + (count - 1) * every] if count > cap else head
    return _cron_walk(schedule, due_ms, now_ms, max(cap, _MAX_CRON_SCAN) + 1)


def _count_overdue(schedule: Schedule, due_ms: int, now_ms: int) -> int:
    if schedule.kind == "interval":
        return (now_ms - due_ms) // schedule.interval_ms() + 1
    # as far as the fires planned from the same walk go (a misfire_cap past the scan)
    return len(_overdue(schedule, due_ms, now_ms, schedule.misfire_cap))


def paused_past(
    schedule: Schedule, next_ms: int | None, now_ms: int, fires_so_far: int
) -> tuple[int, int | None]:
    """The grid times a pause skipped, as its resume at ``now_ms`` finds them: from
    ``next_ms`` (the task's next grid time, where the pause left it) up to now, within
    the grid's end and ``max_runs``: (how many, the last of them; ``(0, None)`` when
    none). A cron's count past ``_MAX_CRON_SCAN`` times is a floor, its last the latest
    cron time before now. Not run for a named reason (``paused``), like any grid time
    not run, they are counted and said, not planned (a resume goes on from the next grid
    time after now: ``actors.store.placement.resume_point``)."""
    last_ms = now_ms if schedule.end_ms is None else min(now_ms, schedule.end_ms)
    if next_ms is None or next_ms > last_ms or schedule.kind == "once":
        return 0, None
    left = None if schedule.max_runs is None else max(0, schedule.max_runs - fires_so_far)
    if schedule.kind == "interval":
        every = schedule.interval_ms()
        count = (last_ms - next_ms) // every + 1
        if left is not None:
            count = min(count, left)
        return (count, next_ms + (count - 1) * every) if count else (0, None)
    cap = _MAX_CRON_SCAN if left is None else min(left, _MAX_CRON_SCAN)
    walk = _cron_walk(schedule, next_ms, last_ms, cap + 1)
    if len(walk) > cap:  # past the cap: a floor, the last one exact
        if left is not None and left <= _MAX_CRON_SCAN:
            return left, walk[left - 1] if left else None
        return cap, _latest_cron(schedule, last_ms)
    return (len(walk), walk[-1]) if walk else (0, None)


def _cron_walk(schedule: Schedule, first_ms: int, last_ms: int, most: int) -> list[int]:
    """A cron's times from ``first_ms`` (one of them) up to ``last_ms`` (within the grid's
    end), at most ``most``: the chain of ``Schedule.next_after`` from ``first_ms``, walked
    on one iterator. A fresh iterator a step (``next_after``) costs three to four times as
    much, and a poller back from an outage, or a resume, walks a missed day of a
    per-minute cron for each such task. A time at or before the one before it (an hour a
    clock set back repeats) is passed over, as ``next_after`` passes it."""
    assert schedule.cron is not None
    if schedule.end_ms is not None:
        last_ms = min(last_ms, schedule.end_ms)
    out = [first_ms]
    start = dt.datetime.fromtimestamp(first_ms / 1000, tz=zoneinfo.ZoneInfo(schedule.tz))
    try:
        for t in cronsim.CronSim(schedule.cron, start):
            if len(out) >= most:
                break
            ms = int(t.timestamp() * 1000)
            if ms > last_ms:
                break
            if ms > out[-1]:
                out.append(ms)
    except (OverflowError, ValueError, StopIteration):
        pass
    return out
