"""When a task fires: interval, cron (with an IANA time zone) and one-shot schedules.

All times are epoch milliseconds (``*_ms``). The functions here are pure: "now" is an
argument, and it is always Redis's clock (``TIME`` read by a script), so a node with a
skewed clock never fires early or late.

- **interval**: drift-free; the grid is ``start + k * every``, and the fire after ``due`` is
  ``due + every``, never ``now + every``.
- **cron**: five fields, evaluated in ``tz`` by cronsim. Across a DST gap a time that does not
  exist fires once at the first valid minute after it, unless the minute or hour field
  starts with ``*`` (then the gap's times do not fire); across a fold a job fires once
  (the first occurrence), one whose minute or hour field starts with ``*`` on both sides.
- **once**: fires at ``at_ms``, then the task is finished.

A cron minute or hour may be ``H`` (``H 9 * * *``): chosen from the task id when the task is
created or its schedule replaced, and stored resolved (``actors.domain.cron_hash``).

Common options: ``start_ms``/``end_ms`` bound the grid, ``max_runs`` caps the fires,
``spread_s`` delays every fire of a task by the same offset below it, chosen from the task
id, and ``jitter_s`` each fire by a fresh random amount up to it (neither moves the grid
itself: ``score_ms`` is where both are added), and
``misfire`` decides what happens to fires missed while nothing ran:
``coalesce`` (default: fire once for all of them, then continue on the grid), ``skip``
(fire none, continue on the grid) or ``fire_all`` (fire each, at most ``misfire_cap``);
``actors.domain.misfires`` applies it.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import hashlib
import itertools
import math
import random
import zoneinfo
from typing import Any, Literal

import attrs
import cronsim

from actors.domain.cron_hash import is_hashed, resolutions, resolve_hashed

Kind = Literal["interval", "cron", "once"]
Misfire = Literal["coalesce", "skip", "fire_all"]
Overlap = Literal["allow_all", "skip", "buffer_one", "buffer_all", "cancel_other"]

#: Cron times examined for the shortest gap a spread must fit in (a year of a daily job).
_GAP_SAMPLE = 400


#: The last millisecond of year 9999: later times cannot be dates (or cron grid points).
MAX_MS = 253_402_300_799_999
#: Cron times drawn past a start before giving up on it (``Schedule._cron_after``): more
#: than an hour of a five-field cron holds, all of which may lie in a repeated hour.
_CRON_DRAWS = 128
#: Longest interval: ten years (a longer one is a one-shot task in disguise).
MAX_EVERY_S = 10 * 366 * 86_400
#: Largest run count a task may be bounded to, and most fires one late claim may enqueue.
MAX_RUNS = 2**53
MAX_MISFIRE_CAP = 10_000
#: Longest catch-up window and spread: a year, and a day.
MAX_CATCHUP_WINDOW_S = 366 * 86_400
MAX_SPREAD_S = 86_400
#: Most dead fires in a row a task may be set to pause after.
MAX_PAUSE_AFTER_FAILURES = 1_000_000


def _check(schedule: Schedule) -> None:
    kind = schedule.kind
    if kind == "interval":
        if schedule.every_s is None:
            raise ValueError("schedule.every_s: required for an interval schedule")
        if not (math.isfinite(schedule.every_s) and 0.001 <= schedule.every_s <= MAX_EVERY_S):
            raise ValueError(
                f"schedule.every_s: must be within 0.001..{MAX_EVERY_S} (ten years), "
                f"got {schedule.every_s!r}"
            )
    if kind == "cron":
        if not schedule.cron:
            raise ValueError("schedule.cron: required for a cron schedule")
        try:
            # An H form is checked as the values any task id would resolve it to.
            cronsim.CronSim(
                resolve_hashed(schedule.cron, ""), dt.datetime(2000, 1, 1, tzinfo=dt.UTC)
            )
        except (cronsim.CronSimError, ValueError) as exc:
            raise ValueError(f"schedule.cron: {schedule.cron!r} is not valid: {exc}") from exc
    if kind == "once" and schedule.at_ms is None:
        raise ValueError("schedule.at_ms: required for a one-shot schedule")
    for name, field, required_kind in (
        ("every_s", schedule.every_s, "interval"),
        ("cron", schedule.cron, "cron"),
        ("at_ms", schedule.at_ms, "once"),
    ):
        if field is not None and kind != required_kind:
            raise ValueError(f"schedule.{name}: only for a {required_kind} schedule, not {kind}")
    try:
        zoneinfo.ZoneInfo(schedule.tz)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
        # OSError: a name that is a directory of the zone database ('America'), or too long
        raise ValueError(f"schedule.tz: unknown time zone {schedule.tz!r}") from None
    for name, ms in (
        ("at_ms", schedule.at_ms),
        ("start_ms", schedule.start_ms),
        ("end_ms", schedule.end_ms),
    ):
        if ms is not None and not 0 <= ms <= MAX_MS:
            raise ValueError(
                f"schedule.{name}: must be Unix milliseconds within 0..{MAX_MS} (year 9999)"
            )
    if (
        schedule.start_ms is not None
        and schedule.end_ms is not None
        and schedule.end_ms < schedule.start_ms
    ):
        raise ValueError("schedule.end_ms: must not be before start_ms")
    if schedule.max_runs is not None and not 1 <= schedule.max_runs <= MAX_RUNS:
        raise ValueError(f"schedule.max_runs: must be within 1..2**53, got {schedule.max_runs}")
    if not (0 <= schedule.jitter_s <= 86_400):
        raise ValueError(f"schedule.jitter_s: must be within 0..86400, got {schedule.jitter_s}")
    window = schedule.catchup_window_s
    if window is not None and not (
        math.isfinite(window) and 0.001 <= window <= MAX_CATCHUP_WINDOW_S
    ):
        raise ValueError(
            f"schedule.catchup_window_s: must be within 0.001..{MAX_CATCHUP_WINDOW_S} "
            f"(a year), got {window!r}"
        )
    if not (math.isfinite(schedule.spread_s) and 0 <= schedule.spread_s <= MAX_SPREAD_S):
        raise ValueError(
            f"schedule.spread_s: must be within 0..{MAX_SPREAD_S}, got {schedule.spread_s!r}"
        )
    failures = schedule.pause_after_failures
    if failures is not None and not 1 <= failures <= MAX_PAUSE_AFTER_FAILURES:
        raise ValueError(
            f"schedule.pause_after_failures: must be within 1..{MAX_PAUSE_AFTER_FAILURES}, "
            f"got {failures}"
        )
    if not 1 <= schedule.misfire_cap <= MAX_MISFIRE_CAP:
        raise ValueError(
            f"schedule.misfire_cap: must be within 1..{MAX_MISFIRE_CAP}, got {schedule.misfire_cap}"
        )


def check_submitted(schedule: Schedule, min_interval_s: float) -> None:
    """Rules for a schedule a client submits now, on top of what any stored schedule
    satisfies (a stored one written by an older version stays readable): an interval of at
    least ``min_interval_s`` (``[api] min_interval_s``), a cron of exactly five fields
    (cronsim would read a sixth as seconds, which the docs do not promise), a named time
    zone (not the host's own), a spread that fits between two fires, and a one-shot time
    within the schedule's bounds (``start_ms`` bounds no other one-shot time: such a task
    fired at ``at_ms`` regardless). ValueError naming the field otherwise."""
    if schedule.every_s is not None and schedule.every_s < min_interval_s:
        raise ValueError(
            f"schedule.every_s: must be at least {min_interval_s:g} s on this node "
            f"([api] min_interval_s), got {schedule.every_s!r}"
        )
    if schedule.cron is not None and len(schedule.cron.split()) != 5:
        raise ValueError(
            f"schedule.cron: must have exactly five fields (minute hour day-of-month month "
            f"day-of-week), got {len(schedule.cron.split())} in {schedule.cron!r}"
        )
    if schedule.tz.rpartition("/")[2] in _LOCAL_ZONES:  # posix/Factory too
        raise ValueError(
            f"schedule.tz: {schedule.tz!r} is no zone of the world (the host's own, or a "
            "placeholder) and may differ from node to node: name one (Europe/Paris, UTC)"
        )
    if schedule.spread_s:
        _check_spread(schedule)
    at, start, end = schedule.at_ms, schedule.start_ms, schedule.end_ms
    if at is not None and ((start is not None and at < start) or (end is not None and at > end)):
        raise ValueError(
            f"schedule.at_ms: {at} is outside start_ms..end_ms ({start}..{end}): the "
            "one-shot would never fire (leave the bounds out of a one-shot schedule)"
        )


#: Names of the zone database that are no zone of the world: the host's own (a link each
#: host sets) or a placeholder: a schedule in them could fire at another time on each node.
#: Matched as a name's last part: the database's ``posix/`` and ``right/`` copies hold
#: them too.
_LOCAL_ZONES = frozenset({"localtime", "posixrules", "Factory"})


def _check_spread(schedule: Schedule) -> None:
    """A spread (with the jitter on top) must end before the next grid time, so that fires
    keep their grid's order and rhythm. Cron gaps are measured over a sample of the
    expression's times, and for an ``H`` cron over the times of every value ``H`` may
    take: in a list (``0,H``) or a stepped range (``H(0-29)/20``) the gap depends on the
    task id, and a schedule is accepted or refused whatever the id. A jitter alone is not
    held to it (schedules written before this rule stay valid); the misfire policy allows
    it at most a grid step (``Schedule.slack_ms``)."""
    gap_ms = _shortest_gap_ms(schedule)
    if gap_ms is not None and (schedule.spread_s + schedule.jitter_s) * 1000 > gap_ms:
        raise ValueError(
            f"schedule.spread_s: spread_s + jitter_s ({schedule.spread_s + schedule.jitter_s:g} "
            f"s) must not exceed the shortest time between two fires ({gap_ms / 1000:g} s)"
        )


def _shortest_gap_ms(schedule: Schedule) -> int | None:
    if schedule.kind == "interval":
        return schedule.interval_ms()
    if schedule.kind != "cron":
        return None
    assert schedule.cron is not None
    return _shortest_cron_gap_ms(schedule.cron, schedule.tz)


@functools.lru_cache(maxsize=256)  # a bulk create checks one schedule per task
def _shortest_cron_gap_ms(cron: str, tz: str) -> int | None:
    start = dt.datetime(2000, 1, 1, tzinfo=zoneinfo.ZoneInfo(tz))
    sample = itertools.islice(cronsim.CronSim(resolve_hashed(cron, ""), start), _GAP_SAMPLE)
    times: list[int] = []
    # a sparse cron (Mondays the fifth of February's weeks) runs past year 9999
    with contextlib.suppress(OverflowError):
        times += (int(t.timestamp() * 1000) for t in sample)
    gap = min((b - a for a, b in itertools.pairwise(times)), default=None)
    if not is_hashed(cron):
        return gap
    own = min(_daily_gap_ms(resolved) for resolved in resolutions(cron))
    return own if gap is None else min(gap, own)


@functools.lru_cache(maxsize=4096)  # resolutions shared by the H crons checked
def _daily_gap_ms(cron: str) -> int:
    """The shortest time between two fires of a resolved cron, from its minutes and hours
    (what an ``H`` picks) and the fewest days between two days it fires on: cheap enough
    for each of an ``H`` cron's 1,440 resolutions. A time-zone change is left to the
    sampled check."""
    parsed = cronsim.CronSim(cron, dt.datetime(2000, 1, 1))
    times = sorted(h * 60 + m for h in parsed.hours for m in parsed.minutes)
    days = _fewest_days_between(" ".join(cron.split()[2:5]))
    gaps = [b - a for a, b in itertools.pairwise(times)]
    gaps.append(days * 1440 - times[-1] + times[0])  # the last of a day to the next's first
    return min(gaps) * 60_000


@functools.lru_cache(maxsize=256)
def _fewest_days_between(day_fields: str) -> int:
    """The fewest days between two days a cron's day-of-month, month and day-of-week
    fields fire on (a sample of its days: a sparse one ends past year 9999)."""
    sample = itertools.islice(
        cronsim.CronSim(f"0 0 {day_fields}", dt.datetime(2000, 1, 1)), _GAP_SAMPLE
    )
    days: list[dt.datetime] = []
    with contextlib.suppress(OverflowError):
        days += sample
    return min(((b - a).days for a, b in itertools.pairwise(days)), default=1)


@attrs.frozen
class Schedule:
    """A task's schedule, as clients send it and as it is stored (compact JSON)."""

    kind: Kind
    every_s: float | None = None
    cron: str | None = None
    tz: str = "UTC"
    at_ms: int | None = None
    start_ms: int | None = None
    end_ms: int | None = None
    max_runs: int | None = None
    jitter_s: float = 0.0
    misfire: Misfire = "coalesce"
    misfire_cap: int = 100
    overlap: Overlap = "allow_all"
    """What a fire due while an earlier fire of the task is in flight does (``allow_all``:
    it runs alongside; see docs/API.md)."""
    catchup_window_s: float | None = None
    """A fire later than this past its due time is not run (reason ``expired``); None:
    however late."""
    spread_s: float = 0.0
    """Every fire is moved by the same offset in ``[0, spread_s)``, chosen from the task id."""
    pause_after_failures: int | None = None
    """Pause the task after this many fires in a row ended dead; None: never."""

    def __attrs_post_init__(self) -> None:
        _check(self)

    def to_dict(self) -> dict[str, Any]:
        """Only the fields that differ from their defaults: small in Redis, stable to compare."""
        out: dict[str, Any] = {"kind": self.kind}
        for field in attrs.fields(Schedule)[1:]:
            value = getattr(self, field.name)
            if value != field.default:
                out[field.name] = value
        return out

    # -- the grid -------------------------------------------------------------------------

    def first_due(self, now_ms: int) -> int | None:
        """The first grid time for a task created at ``now_ms``; None if it never fires."""
        due: int | None
        if self.kind == "interval":
            due = self.start_ms if self.start_ms is not None else now_ms
        elif self.kind == "cron":
            due = self._cron_after(max(now_ms, self.start_ms or now_ms) - 1)
        else:
            assert self.at_ms is not None
            due = self.at_ms
        return self._bounded(due)

    def same_grid(self, other: Schedule) -> bool:
        """Whether both place fires on the same grid times: the same kind, interval or
        cron, time zone, one-shot time and start (bounds, policies, jitter and spread
        may differ). ``H`` fields compare as written: resolve both for a task first."""
        return (self.kind, self.every_s, self.cron, self.tz, self.at_ms, self.start_ms) == (
            other.kind, other.every_s, other.cron, other.tz, other.at_ms, other.start_ms
        )  # fmt: skip

    def next_after(self, due_ms: int) -> int | None:
        """The grid time after ``due_ms`` (drift-free), or None past the end."""
        if self.kind == "interval":
            assert self.every_s is not None
            return self._bounded(due_ms + self.interval_ms())
        if self.kind == "cron":
            return self._bounded(self._cron_after(due_ms))
        return None

    def first_after(self, due_ms: int, now_ms: int) -> int | None:
        """The first grid time strictly after ``now_ms``, on the grid through ``due_ms``."""
        if self.kind == "interval":
            every = self.interval_ms()
            steps = (now_ms - due_ms) // every + 1 if now_ms >= due_ms else 1
            return self._bounded(due_ms + steps * every)
        if self.kind == "cron":
            return self._bounded(self._cron_after(max(now_ms, due_ms)))
        return None

    def offset_ms(self, task_id: str) -> int:
        """The task's spread: a fixed offset in ``[0, spread_s)`` every fire of it is moved
        by, the same on every node, restart and fire (so previews and histories show it),
        and independent of the task's partition (a different hash)."""
        if not self.spread_s:
            return 0
        digest = hashlib.blake2b(task_id.encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big") % max(1, round(self.spread_s * 1000))

    def for_task(self, task_id: str) -> Schedule:
        """The schedule a task stores: ``H`` cron fields resolved from its id
        (``actors.domain.cron_hash``); itself when it has none."""
        if self.cron is None or not is_hashed(self.cron):
            return self
        return attrs.evolve(self, cron=resolve_hashed(self.cron, task_id))

    def fire_ms(self, due_ms: int, task_id: str) -> int:
        """When the fire of grid time ``due_ms`` is enqueued, jitter aside: the grid time
        moved by the task's spread. Previews show this; ``score_ms`` adds the jitter."""
        return due_ms + self.offset_ms(task_id)

    def slack_ms(self, task_id: str | None) -> int:
        """How long after its grid time a fire of the task may be enqueued by design: its
        spread (``task_id`` None: unknown, none) and the most its jitter adds. A claim
        that much later than a grid time has not missed the next one (``plan_fires``, which
        allows at most one grid step: a jitter alone may be longer)."""
        jitter = int(self.jitter_s * 1000) if self.jitter_s else 0
        return jitter + (self.offset_ms(task_id) if task_id is not None else 0)

    def score_ms(self, due_ms: int, task_id: str) -> int:
        """The schedule index score of grid time ``due_ms``: when a poller enqueues it (the
        spread and a fresh jitter draw). Every place that puts a grid time in the index
        (create, update, resume, the poller's commit) uses this."""
        return self.fire_ms(due_ms, task_id) + self.jitter_ms()

    def jitter_ms(self) -> int:
        return int(random.uniform(0, self.jitter_s) * 1000) if self.jitter_s else 0

    def interval_ms(self) -> int:
        """An interval schedule's period in whole milliseconds (at least 1)."""
        assert self.every_s is not None
        return max(1, round(self.every_s * 1000))

    def _bounded(self, due_ms: int | None) -> int | None:
        if due_ms is None or due_ms > MAX_MS:
            return None
        if self.end_ms is not None and due_ms > self.end_ms:
            return None
        return due_ms

    def _cron_after(self, after_ms: int) -> int | None:
        """The cron time strictly after ``after_ms``; None past year 9999.

        cronsim works in whole minutes and returns times after ``start`` on the wall
        clock: in the second pass of an hour a clock set back repeats (DST ending), the
        times it returns first are that hour's first pass, before ``after_ms``, which a
        grid takes once (the first pass). They are passed over here: a time at or before
        ``after_ms`` would be planned again and again."""
        assert self.cron is not None
        zone = zoneinfo.ZoneInfo(self.tz)
        try:
            start = dt.datetime.fromtimestamp(after_ms / 1000, tz=zone)
            for _ in range(2):  # the second from past any repeated hour
                for t in itertools.islice(cronsim.CronSim(self.cron, start), _CRON_DRAWS):
                    ms = int(t.timestamp() * 1000)
                    if ms > after_ms:
                        return ms
                start += dt.timedelta(hours=2)
        except (OverflowError, ValueError, StopIteration):
            return None
        return None
