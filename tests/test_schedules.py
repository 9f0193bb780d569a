"""Schedules: the grid, DST, bounds and misfire policies (pure functions, no Redis)."""

from __future__ import annotations

import datetime as dt
import itertools
import zoneinfo

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from actors.domain.errors import InvalidTask
from actors.domain.misfires import paused_past, plan_fires
from actors.domain.model import parse_schedule
from actors.domain.schedules import MAX_EVERY_S, Schedule, check_submitted
from actors.scheduling.tick_plan import plan_fire
from actors.store.replies import Claimed

T0 = 1_800_000_000_000  # 2027-01-15, a whole second


def ms(zone: str, year: int, month: int, day: int, hour: int = 0, minute: int = 0) -> int:
    when = dt.datetime(year, month, day, hour, minute, tzinfo=zoneinfo.ZoneInfo(zone))
    return int(when.timestamp() * 1000)


def iso(zone: str, when_ms: int) -> str:
    return dt.datetime.fromtimestamp(when_ms / 1000, zoneinfo.ZoneInfo(zone)).isoformat()


def run_grid(schedule: Schedule, first: int, count: int) -> list[int]:
    out, cur = [first], first
    for _ in range(count - 1):
        nxt = schedule.next_after(cur)
        assert nxt is not None
        out.append(nxt)
        cur = nxt
    return out


# -- interval ---------------------------------------------------------------------------


def test_interval_first_fire_is_now_or_start() -> None:
    assert Schedule("interval", every_s=10).first_due(T0) == T0
    assert Schedule("interval", every_s=10, start_ms=T0 + 5).first_due(T0) == T0 + 5


def test_interval_is_drift_free() -> None:
    schedule = Schedule("interval", every_s=0.1)
    # A late fire (served 37 ms after its due time) does not move the grid.
    plan = plan_fires(schedule, T0, T0 + 37, 0)
    assert plan.fires == (T0,)
    assert plan.next_ms == T0 + 100


def test_interval_respects_end_and_max_runs() -> None:
    schedule = Schedule("interval", every_s=1, end_ms=T0 + 2500)
    assert run_grid(schedule, T0, 3) == [T0, T0 + 1000, T0 + 2000]
    assert schedule.next_after(T0 + 2000) is None
    capped = Schedule("interval", every_s=1, max_runs=2)
    assert plan_fires(capped, T0, T0, 0).next_ms == T0 + 1000
    assert plan_fires(capped, T0 + 1000, T0 + 1000, 1) == plan_fires(
        capped, T0 + 1000, T0 + 1000, 1
    )
    last = plan_fires(capped, T0 + 1000, T0 + 1000, 1)
    assert last.fires == (T0 + 1000,)
    assert last.next_ms is None


# -- cron and DST -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("zone", "day"),
    [("Europe/Berlin", (2027, 3, 28)), ("America/New_York", (2027, 3, 14))],
)
def test_cron_in_a_spring_forward_gap_fires_once_after_the_gap(
    zone: str, day: tuple[int, int, int]
) -> None:
    schedule = Schedule("cron", cron="30 2 * * *", tz=zone)
    first = schedule.first_due(ms(zone, day[0], day[1], day[2] - 1, 12, 0))
    assert first is not None
    grid = run_grid(schedule, first, 3)
    # 02:30 does not exist that night: it fires once, at 03:00, then 02:30 again.
    assert [iso(zone, t)[11:16] for t in grid] == ["03:00", "02:30", "02:30"]
    assert iso(zone, grid[0])[:10] == dt.date(*day).isoformat()


@pytest.mark.parametrize(
    ("zone", "day", "repeated_hour"),
    [("Europe/Berlin", (2027, 10, 31), 2), ("America/New_York", (2027, 11, 7), 1)],
)
def test_cron_in_a_fall_back_fold(zone: str, day: tuple[int, int, int], repeated_hour: int) -> None:
    daily = Schedule("cron", cron=f"30 {repeated_hour} * * *", tz=zone)
    first = daily.first_due(ms(zone, day[0], day[1], day[2] - 1, 12, 0))
    assert first is not None
    grid = run_grid(daily, first, 2)
    # The wall time happens twice that night; a daily job fires once (the first), and the
    # next fire is 25 real hours later.
    assert iso(zone, grid[0])[:10] == dt.date(*day).isoformat()
    assert grid[1] - grid[0] == 25 * 3600 * 1000
    half_hourly = Schedule("cron", cron="*/30 * * * *", tz=zone)
    fold = run_grid(half_hourly, half_hourly.first_due(ms(zone, *day, 0, 10)) or 0, 6)
    # Every 30 real minutes through the fold: nothing skipped, nothing doubled.
    assert [b - a for a, b in itertools.pairwise(fold)] == [30 * 60 * 1000] * 5


@pytest.mark.parametrize(
    ("zone", "cron"),
    [
        ("Europe/Berlin", "*/7 * * * *"),
        ("America/New_York", "15,45 1-3 * * *"),
        ("Australia/Lord_Howe", "*/10 1-3 * * *"),  # a 30-minute clock change
        ("America/Santiago", "0 * * * *"),  # the change at midnight
        ("Pacific/Chatham", "45 2-4 * * *"),
    ],
)
@pytest.mark.parametrize("month", [3, 4, 9, 10, 11])
def test_a_crons_missed_times_across_a_clock_change_are_its_grid_each_once(
    zone: str, cron: str, month: int
) -> None:
    """A poller back after three days planning ``fire_all`` fires (and counting the
    misses past the cap) walks the same times as the grid does one ``next_after`` at a
    time, through whatever clock change the days hold."""
    schedule = Schedule("cron", cron=cron, tz=zone, misfire="fire_all", misfire_cap=10_000)
    for day in (1, 8, 15, 22, 29):
        due = schedule.first_due(ms(zone, 2024, month, day))
        assert due is not None
        now = due + 3 * 24 * 3_600_000
        grid = [t for t in run_grid(schedule, due, 1_200) if t <= now]
        plan = plan_fires(schedule, due, now, 0)
        assert list(plan.fires) == grid[: len(plan.fires)]
        assert len(plan.fires) == min(len(grid), 1_001)  # the scan's bound
        assert plan.next_ms == schedule.next_after(plan.fires[-1]) or len(grid) > 1_001


def test_a_crons_missed_times_walked_from_inside_the_repeated_hour_are_its_grid() -> None:
    zone = "America/New_York"
    schedule = Schedule("cron", cron="*/20 * * * *", tz=zone, misfire="fire_all")
    second_pass = dt.datetime(2024, 11, 3, 1, 0, fold=1, tzinfo=zoneinfo.ZoneInfo(zone))
    due = int(second_pass.timestamp() * 1000)
    assert schedule.next_after(due - 1) == due  # a grid time of the second pass
    plan = plan_fires(schedule, due, due + 3 * 3_600_000, 0)
    assert list(plan.fires) == run_grid(schedule, due, 10)
    assert iso(zone, plan.fires[1]) == "2024-11-03T01:20:00-05:00"


@pytest.mark.parametrize("misfire", ["coalesce", "fire_all", "skip"])
def test_a_cron_planned_from_inside_the_repeated_hour_fires_each_time_once(misfire: str) -> None:
    """A task created, resumed or claimed late in the second pass of the hour a fall-back
    repeats: cronsim, given that time, answers the hour's first-pass times, before it.
    Planned as a poller plans it, tick after tick through the hour, no grid time fires
    twice, none is from the day before, and the grid moves on to the next day."""
    zone = "America/New_York"
    fold = zoneinfo.ZoneInfo(zone)
    second_pass = int(dt.datetime(2024, 11, 3, 1, 10, fold=1, tzinfo=fold).timestamp() * 1000)
    first_pass = second_pass - 3_600_000  # 01:10 EDT: the outage began before the fold
    schedule = Schedule("cron", cron="20,40 1 * * *", tz=zone, misfire=misfire)  # type: ignore[arg-type]
    for created in (first_pass, second_pass):
        due = schedule.first_due(created)
        assert due is not None and due > created
    due = schedule.first_due(first_pass)  # 01:20 EDT; the poller comes back at 01:10 EST
    assert due is not None
    fired: list[int] = []
    now, runs = second_pass, 0
    while now < second_pass + 3_600_000 and due is not None:
        if due <= now:
            plan = plan_fires(schedule, due, now, runs)
            assert plan.next_ms is None or plan.next_ms > now  # never planned again at once
            fired += plan.fires
            runs += len(plan.fires)
            due = plan.next_ms
        now += 20  # the poller's shortest tick
    assert len(fired) == len(set(fired))  # none twice
    assert all(first_pass - 3_600_000 <= t <= second_pass for t in fired)  # none a day early
    assert due is not None and iso(zone, due) == "2024-11-04T01:20:00-05:00"


def test_cron_grid_is_wall_clock_in_its_zone() -> None:
    schedule = Schedule("cron", cron="0 9 * * 1-5", tz="Asia/Tokyo")
    start = ms("Asia/Tokyo", 2027, 1, 15, 10, 0)  # a Friday, after 09:00
    first = schedule.first_due(start)
    assert first is not None
    assert iso("Asia/Tokyo", first) == "2027-01-18T09:00:00+09:00"  # the next Monday


# -- one-shot -------------------------------------------------------------------------------


def test_one_shot_fires_once_then_finishes() -> None:
    schedule = Schedule("once", at_ms=T0 + 5000)
    assert schedule.first_due(T0) == T0 + 5000
    plan = plan_fires(schedule, T0 + 5000, T0 + 5001, 0)
    assert plan.fires == (T0 + 5000,)
    assert plan.next_ms is None


def test_one_shot_in_the_past_still_fires() -> None:
    schedule = Schedule("once", at_ms=T0 - 60_000)
    assert schedule.first_due(T0) == T0 - 60_000
    assert plan_fires(schedule, T0 - 60_000, T0, 0).fires == (T0 - 60_000,)


# -- misfires -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "fires", "missed"),
    [
        ("coalesce", (T0 + 9000,), 9),  # one fire, standing for the latest grid time
        ("skip", (), 10),
        ("fire_all", tuple(T0 + k * 1000 for k in range(10)), 0),
    ],
)
def test_misfire_policies_after_a_downtime(
    policy: str, fires: tuple[int, ...], missed: int
) -> None:
    schedule = Schedule("interval", every_s=1, misfire=policy)  # type: ignore[arg-type]
    plan = plan_fires(schedule, T0, T0 + 9500, 0)  # 10 grid times came and went
    assert plan.fires == fires
    assert plan.missed == missed
    assert plan.next_ms == T0 + 10_000  # back on the grid


@pytest.mark.parametrize(
    ("policy", "fires", "missed"),
    [
        ("coalesce", (T0, T0 + 1000, T0 + 2000, T0 + 3000, T0 + 9000), 5),
        ("skip", (T0, T0 + 1000, T0 + 2000, T0 + 3000), 6),
        ("fire_all", tuple(T0 + k * 1000 for k in range(10)), 0),
    ],
)
def test_grid_times_a_dead_claim_blocked_are_owed_whatever_the_policy(
    policy: str, fires: tuple[int, ...], missed: int
) -> None:
    """A dead poller's claim blocked the task until T0 + 3500: the grid times due until
    then are fired as they are; the policy governs the ones after (downtime)."""
    schedule = Schedule("interval", every_s=1, misfire=policy)  # type: ignore[arg-type]
    plan = plan_fires(schedule, T0, T0 + 9500, 0, owed_until_ms=T0 + 3500)
    assert (plan.fires, plan.missed, plan.next_ms) == (fires, missed, T0 + 10_000)


def test_owed_fires_are_capped_and_respect_max_runs() -> None:
    capped = Schedule("interval", every_s=1, misfire_cap=2)
    plan = plan_fires(capped, T0, T0 + 9500, 0, owed_until_ms=T0 + 9500)
    assert (plan.fires, plan.missed, plan.next_ms) == ((T0, T0 + 1000), 8, T0 + 10_000)
    limited = Schedule("interval", every_s=1, max_runs=3)
    plan = plan_fires(limited, T0, T0 + 9500, 2, owed_until_ms=T0 + 9500)
    assert (plan.fires, plan.next_ms) == ((T0,), None)  # the third run, then finished


def test_an_owed_fire_due_alone_is_just_a_fire() -> None:
    schedule = Schedule("interval", every_s=10)
    assert plan_fires(schedule, T0, T0 + 500, 0, owed_until_ms=T0 + 400) == plan_fires(
        schedule, T0, T0 + 500, 0
    )


def test_fire_all_is_capped() -> None:
    schedule = Schedule("interval", every_s=1, misfire="fire_all", misfire_cap=3)
    plan = plan_fires(schedule, T0, T0 + 9500, 0)
    assert plan.fires == (T0, T0 + 1000, T0 + 2000)
    assert plan.missed == 7


def test_cron_coalesce_stands_for_the_latest_missed_time() -> None:
    schedule = Schedule("cron", cron="*/5 * * * *")
    due = ms("UTC", 2027, 1, 1, 10, 0)
    plan = plan_fires(schedule, due, due + 22 * 60_000, 0)
    assert plan.fires == (due + 20 * 60_000,)
    assert plan.missed == 4
    assert plan.next_ms == due + 25 * 60_000


# -- validation -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"kind": "interval"}, "schedule.every_s: required"),
        ({"kind": "interval", "every_s": 0}, "schedule.every_s: must be within 0.001.."),
        # Past what a stored schedule can hold: a 4xx naming the field, never an overflow.
        ({"kind": "interval", "every_s": 1e308}, "schedule.every_s: must be within"),
        ({"kind": "interval", "every_s": 18446744073709551616}, "schedule.every_s: must be"),
        ({"kind": "interval", "every_s": 1, "max_runs": 2**64}, "max_runs: must be within"),
        ({"kind": "interval", "every_s": 1, "misfire_cap": 2**70}, "misfire_cap: must be"),
        ({"kind": "cron", "cron": "61 * * * *"}, "schedule.cron: '61 * * * *' is not valid"),
        ({"kind": "cron", "cron": "* * * * *", "tz": "Mars/Base"}, "unknown time zone"),
        ({"kind": "once"}, "schedule.at_ms: required"),
        ({"kind": "weekly"}, "schedule.kind"),
        ({"kind": "interval", "every_s": 1, "cron": "* * * * *"}, "schedule.cron: only for"),
        ({"kind": "interval", "every_s": 1, "misfire": "later"}, "schedule.misfire"),
        ({"kind": "interval", "every_s": 1, "evry": 2}, "unknown key 'evry'"),
        ({"kind": "interval", "every_s": 1, "start_ms": 5, "end_ms": 4}, "end_ms: must not"),
        ({"kind": "interval", "every_s": 1, "max_runs": 0}, "max_runs: must be within 1.."),
    ],
)
def test_bad_schedules_are_refused_naming_the_field(data: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidTask) as info:
        parse_schedule(data)
    assert message in str(info.value)


def test_stored_form_keeps_only_non_defaults() -> None:
    schedule = Schedule("cron", cron="0 * * * *", tz="Europe/Paris")
    assert schedule.to_dict() == {"kind": "cron", "cron": "0 * * * *", "tz": "Europe/Paris"}
    assert parse_schedule(schedule.to_dict()) == schedule


# -- properties ---------------------------------------------------------------------------

every_ms = st.integers(min_value=1, max_value=86_400_000)
times = st.integers(min_value=T0 - 10**10, max_value=T0 + 10**10)


@given(every=every_ms, due=times, late=st.integers(min_value=0, max_value=10**9))
def test_interval_next_run_is_after_now_and_on_the_grid(every: int, due: int, late: int) -> None:
    schedule = Schedule("interval", every_s=every / 1000, misfire="skip")
    now = due + late
    plan = plan_fires(schedule, due, now, 0)
    assert plan.next_ms is not None
    assert plan.next_ms > now
    assert plan.next_ms > due
    assert (plan.next_ms - due) % schedule.interval_ms() == 0


@given(
    due=times,
    late=st.integers(min_value=0, max_value=10**8),
    policy=st.sampled_from(["coalesce", "skip", "fire_all"]),
)
@settings(max_examples=50)
def test_cron_next_run_is_strictly_after_now(due: int, late: int, policy: str) -> None:
    schedule = Schedule("cron", cron="*/7 * * * *", tz="Europe/Berlin", misfire=policy)  # type: ignore[arg-type]
    first = schedule.first_due(due)
    assert first is not None
    plan = plan_fires(schedule, first, first + late, 0)
    assert plan.next_ms is not None
    assert plan.next_ms > first + late
    assert all(first <= f <= first + late for f in plan.fires)


@given(
    start=times,
    span=st.integers(min_value=0, max_value=10**7),
    every=st.integers(min_value=1000, max_value=10**6),
    runs=st.integers(min_value=1, max_value=20),
)
def test_bounds_and_max_runs_are_honoured(start: int, span: int, every: int, runs: int) -> None:
    schedule = Schedule(
        "interval", every_s=every / 1000, start_ms=start, end_ms=start + span, max_runs=runs
    )
    due = schedule.first_due(start - 1)
    fired: list[int] = []
    while due is not None and len(fired) < 100:
        plan = plan_fires(schedule, due, due, len(fired))
        fired += plan.fires
        due = plan.next_ms
    assert len(fired) <= runs
    assert all(start <= f <= start + span for f in fired)
    assert fired == sorted(set(fired))


@given(
    start=times,
    span=st.integers(min_value=0, max_value=10**7),
    every=st.integers(min_value=1000, max_value=10**6),
    late=st.integers(min_value=0, max_value=10**8),
    policy=st.sampled_from(["coalesce", "skip", "fire_all"]),
    owed=st.booleans(),
)
def test_a_late_claim_fires_nothing_past_the_end(
    start: int, span: int, every: int, late: int, policy: str, owed: bool
) -> None:
    """A claim long after the grid ended (nodes down across ``end_ms``) fires and counts
    only the grid times up to it, whatever the misfire policy, owed times included."""
    end = start + span
    schedule = Schedule(
        "interval",
        every_s=every / 1000,
        start_ms=start,
        end_ms=end,
        misfire=policy,  # type: ignore[arg-type]
    )
    now = start + late
    plan = plan_fires(schedule, start, now, 0, owed_until_ms=now if owed else None)
    assert all(start <= f <= min(end, now) for f in plan.fires)
    grid = span // schedule.interval_ms() + 1 if now >= end else None
    if grid is not None:
        assert plan.next_ms is None
        assert len(plan.fires) + plan.missed == grid


def test_a_late_cron_claim_coalesces_to_the_last_time_before_the_end() -> None:
    hour = 3_600_000
    start = 1_767_225_600_000  # 2026-01-01 00:00 UTC
    schedule = Schedule("cron", cron="0 * * * *", start_ms=start, end_ms=start + 5 * hour)
    plan = plan_fires(schedule, start, start + 30 * hour, 0)
    assert plan.fires == (start + 5 * hour,) and plan.missed == 5 and plan.next_ms is None
    skip = Schedule(
        "cron", cron="0 * * * *", start_ms=start, end_ms=start + 5 * hour, misfire="skip"
    )
    assert plan_fires(skip, start, start + 30 * hour, 0).missed == 6


@pytest.mark.parametrize(
    "data",
    [
        {"kind": "once", "at_ms": -1},
        {"kind": "once", "at_ms": 10**18},
        {"kind": "cron", "cron": "* * * * *", "start_ms": 10**18},
        {"kind": "interval", "every_s": 60, "end_ms": 253_402_300_800_000},
    ],
)
def test_times_beyond_what_a_date_can_say_are_refused(data: dict[str, object]) -> None:
    with pytest.raises(InvalidTask, match="year 9999"):
        parse_schedule(data)


def test_a_grid_that_runs_past_year_9999_ends_there() -> None:
    last_ms = 253_402_300_799_999
    cron = Schedule("cron", cron="* * * * *", start_ms=last_ms)
    assert cron.first_due(0) is None
    interval = Schedule("interval", every_s=MAX_EVERY_S)
    assert interval.next_after(last_ms - 1_000) is None


@pytest.mark.parametrize("policy", ["coalesce", "skip", "fire_all"])
def test_a_claim_placed_late_by_the_spread_and_jitter_is_no_misfire(policy: str) -> None:
    """A fire is enqueued its spread offset (and up to its jitter) after its grid time, by
    design; a poller a little behind then claims it after the next grid time. That time
    has not come (its own fire is placed as late): the claimed one fires, nothing is missed."""
    schedule = Schedule("interval", every_s=10, spread_s=6, jitter_s=3.9, misfire=policy)  # type: ignore[arg-type]
    task_id = next(t for t in (f"t{i}" for i in range(1000)) if schedule.offset_ms(t) > 5_900)
    due = 1_767_225_600_000
    claimed = Claimed(task_id, 0, "work", b"{}", schedule, due, 0)
    late = due + schedule.slack_ms(task_id) + 200  # past the next grid time, by the poller's lag
    assert late > due + 10_000
    plan = plan_fire(claimed, late)
    assert (plan.fires, plan.missed) == ((due,), 0)
    assert plan.next_ms == due + 10_000


@pytest.mark.parametrize(
    ("schedule", "step_ms"),
    [
        (Schedule("interval", every_s=10, jitter_s=30, misfire="skip"), 10_000),
        (Schedule("cron", cron="* * * * *", jitter_s=180, misfire="skip"), 60_000),
    ],
)
def test_a_jitter_alone_longer_than_the_grid_step_is_allowed_one_step(
    schedule: Schedule, step_ms: int
) -> None:
    """A jitter alone is not held to the grid step (no rule for it), but a claim more than
    one step late has missed grid times whatever the placement."""
    assert schedule.slack_ms("t") == 3 * step_ms
    due = 1_767_225_600_000  # a whole minute
    claimed = Claimed("t", 0, "work", b"{}", schedule, due, 0)
    assert plan_fire(claimed, due + step_ms * 3 // 2).fires == (due,)  # within a step more
    late = plan_fire(claimed, due + step_ms * 5 // 2)  # past it: missed, skipped
    assert (late.fires, late.missed) == ((), 2)


def test_a_sparse_cron_with_a_spread_is_taken() -> None:
    """Mondays that are the fifth of their week in February: a few a century, the sample
    the spread is checked against runs past year 9999 (an OverflowError, once a 500)."""
    schedule = parse_schedule({"kind": "cron", "cron": "0 0 * 2 MON#5", "spread_s": 60})
    check_submitted(schedule, min_interval_s=1.0)  # a node's rules for a new schedule


def test_fire_all_past_the_cron_scan_counts_no_negative_misses() -> None:
    """A cron whose misfire_cap is past the 1,000 times the scan counts: as many fires as
    overdue times, and none counted missed (never a negative count)."""
    schedule = Schedule("cron", cron="* * * * *", misfire="fire_all", misfire_cap=3000)
    due = schedule.first_due(T0)
    assert due is not None
    plan = plan_fires(schedule, due, due + 2000 * 60_000, 0)
    assert (len(plan.fires), plan.missed) == (2001, 0)


@pytest.mark.parametrize("cap", [10, 1000, 1500])
def test_fire_all_past_the_cron_scan_counts_the_times_left_as_missed(cap: int) -> None:
    """A minutely cron with fire_all, down for a week: the fires are capped, and the grid
    times past them count as missed (at least the scan's worth: a floor), never none."""
    schedule = Schedule("cron", cron="* * * * *", misfire="fire_all", misfire_cap=cap)
    due = schedule.first_due(T0)
    assert due is not None
    plan = plan_fires(schedule, due, due + 7 * 24 * 60 * 60_000, 0)
    assert len(plan.fires) == cap
    assert plan.missed >= max(1, 1000 + 1 - cap)
    assert plan.next_ms == due + (7 * 24 * 60 + 1) * 60_000


def test_owed_times_start_where_the_dead_poller_stopped_claiming() -> None:
    """``owed_from_ms``: the grid times before it are under the policy, as if claimed then
    (``coalesce``: one fire for them; ``skip``: none), those from it to ``owed_until_ms``
    are all fired, and a due time alone before it fires as any first time does."""
    every = Schedule("interval", every_s=1, start_ms=0, misfire="coalesce")
    plan = plan_fires(every, 0, 20_500, 0, owed_until_ms=20_000, owed_from_ms=15_500)
    assert plan.fires == (15_000, 16_000, 17_000, 18_000, 19_000, 20_000)
    assert (plan.next_ms, plan.missed) == (21_000, 15)
    skip = attrs.evolve(every, misfire="skip")
    plan = plan_fires(skip, 0, 20_500, 0, owed_until_ms=20_000, owed_from_ms=15_500)
    assert plan.fires == (16_000, 17_000, 18_000, 19_000, 20_000) and plan.missed == 16
    plan = plan_fires(skip, 15_000, 20_500, 0, owed_until_ms=20_000, owed_from_ms=15_500)
    assert plan.fires == (15_000, 16_000, 17_000, 18_000, 19_000, 20_000)
    capped = attrs.evolve(skip, max_runs=3)
    plan = plan_fires(capped, 0, 20_500, 0, owed_until_ms=20_000, owed_from_ms=15_500)
    assert (plan.fires, plan.next_ms) == ((16_000, 17_000, 18_000), None)


def test_a_dead_claim_owes_every_time_from_its_due_one_to_a_task_created_before() -> None:
    """A poller renews its lease (10 s) at 0, claims a task due 0 and dies; another takes
    the partition over at 30 s: owed until 20 s (its lease end plus a lease), from the
    renewal at 0. A task that existed before owes every time from 0, under ``skip`` too;
    one created during the gap owes from the renewal (here 0 as well: nothing is lost)."""
    every = Schedule("interval", every_s=1, start_ms=0, misfire="skip")
    old = Claimed(
        "x", 0, "work", b"{}", every, 0, 0, owed_until_ms=20_000, updated_ms=-5_000,
        owed_from_ms=0,
    )  # fmt: skip
    plan = plan_fire(old, 30_000)
    assert plan.fires == tuple(range(0, 20_001, 1000)) and plan.next_ms == 31_000
    new = attrs.evolve(old, updated_ms=15_000)
    assert plan_fire(new, 30_000).fires == plan.fires
    # Created later, with a longer past: the times up to the old poller's last renewal
    # are under the policy (skipped), those after it to the owed end fired.
    late = attrs.evolve(new, owed_until_ms=50_000, updated_ms=45_000, owed_from_ms=30_000)
    plan = plan_fire(late, 60_000)
    assert plan.fires == tuple(range(31_000, 50_001, 1000)) and plan.missed == 31 + 10
    # The renewal unknown (NONE: a clock that stepped back): owed from the due time.
    assert plan_fire(attrs.evolve(late, owed_from_ms=None), 60_000).fires[0] == 0


def test_a_time_past_the_owed_end_is_not_owed() -> None:
    """The times under the policy before ``owed_from_ms`` end past the owed end: nothing
    after is owed (each under the policy: ``skip``), rather than the first one fired."""
    every = Schedule("interval", every_s=30, start_ms=0, misfire="skip")
    plan = plan_fires(every, 60_000, 200_000, 0, owed_until_ms=110_000, owed_from_ms=100_000)
    assert (plan.fires, plan.next_ms, plan.missed) == ((), 210_000, 5)


def test_owed_times_start_later_by_the_slack_of_a_spread_task() -> None:
    """A spread task's grid time is due its slack after it: one whose slack runs past
    ``owed_from_ms`` was not yet due when the dead poller last claimed, so it is owed."""
    every = Schedule("interval", every_s=60, start_ms=0, misfire="skip")
    plan = plan_fires(
        every, 0, 300_000, 0, owed_until_ms=200_000, owed_from_ms=100_000, slack_ms=50_000
    )
    assert plan.fires == (0, 60_000, 120_000, 180_000, 240_000) and plan.next_ms == 300_000


@pytest.mark.parametrize(
    "zone", ["localtime", "posixrules", "Factory", "posix/Factory", "right/Factory"]
)
def test_a_submitted_schedule_in_the_hosts_own_zone_is_refused(zone: str) -> None:
    """Names of the zone database that stand for the host's own zone would fire a cron
    at another time on each node; so would a placeholder, under any of its folders."""
    schedule = Schedule("cron", cron="0 9 * * *", tz=zone)
    with pytest.raises(ValueError, match=f"schedule.tz: '{zone}' is no zone of the world"):
        check_submitted(schedule, 1.0)


@pytest.mark.parametrize(("start_ms", "end_ms"), [(T0 + 1, None), (None, T0 - 1), (T0 + 1, T0 + 2)])
def test_a_submitted_one_shot_outside_its_bounds_is_refused(
    start_ms: int | None, end_ms: int | None
) -> None:
    """A one-shot time before ``start_ms`` fired all the same, one after ``end_ms`` never:
    either is a task that does not do what it says; refused, naming ``at_ms``."""
    schedule = Schedule("once", at_ms=T0, start_ms=start_ms, end_ms=end_ms)
    with pytest.raises(ValueError, match=r"schedule\.at_ms: .* outside start_ms\.\.end_ms"):
        check_submitted(schedule, 1.0)
    check_submitted(attrs.evolve(schedule, start_ms=None, end_ms=None), 1.0)
    check_submitted(attrs.evolve(schedule, start_ms=T0, end_ms=T0), 1.0)


def test_the_grid_times_a_pause_skipped_are_counted_within_the_grid() -> None:
    """``paused_past``: from the task's next grid time up to the resume, none past the
    grid's end or its ``max_runs``; a cron's walk counted (its last the latest before the
    resume, also past the scan)."""
    every = Schedule("interval", every_s=10, start_ms=0)
    assert paused_past(every, 100_000, 130_000, 0) == (4, 130_000)
    assert paused_past(every, 100_000, 99_999, 0) == (0, None)  # resumed before it came
    assert paused_past(every, None, 130_000, 0) == (0, None)
    capped = Schedule("interval", every_s=10, start_ms=0, max_runs=5)
    assert paused_past(capped, 100_000, 200_000, 3) == (2, 110_000)
    assert paused_past(capped, 100_000, 200_000, 5) == (0, None)
    ended = Schedule("interval", every_s=10, start_ms=0, end_ms=125_000)
    assert paused_past(ended, 100_000, 200_000, 0) == (3, 120_000)
    cron = Schedule("cron", cron="*/5 * * * *", tz="UTC")
    base = 1_800_000_000_000 - 1_800_000_000_000 % 300_000
    assert paused_past(cron, base, base + 3_600_000, 0) == (13, base + 3_600_000)
    count, last = paused_past(cron, base, base + 10 * 86_400_000 + 1, 0)
    assert count >= 1000 and last == base + 10 * 86_400_000  # a floor; the last exact
