"""Previews and herd spreading, pure: ``upcoming`` against the poller's own steps
(``plan_fires``, ``next_after``) across DST changes, bounds and misfires; the DST notes;
``H`` cron fields; the spread rule."""

from __future__ import annotations

import datetime as dt
import zoneinfo

import pytest

from actors.domain.cron_hash import resolve_hashed
from actors.domain.misfires import plan_fires
from actors.domain.preview import dst_notes, preview, rows, upcoming
from actors.domain.schedules import Schedule, check_submitted


def ms(zone: str, year: int, month: int, day: int, hour: int = 0, minute: int = 0) -> int:
    moment = dt.datetime(year, month, day, hour, minute, tzinfo=zoneinfo.ZoneInfo(zone))
    return int(moment.timestamp() * 1000)


def poller_run(schedule: Schedule, first: int, count: int, task_id: str) -> list[tuple[int, int]]:
    """What pollers claiming on time do: (due, claim time) per fire, the grid moved on by
    ``plan_fires`` at each claim."""
    out: list[tuple[int, int]] = []
    due: int | None = first
    while due is not None and len(out) < count:
        claim_ms = schedule.fire_ms(due, task_id)
        plan = plan_fires(schedule, due, claim_ms, len(out))
        out += [(f, claim_ms) for f in plan.fires]
        due = plan.next_ms
    return out


BERLIN = "Europe/Berlin"
DST_CHANGES = [
    ("*/30 * * * *", ms(BERLIN, 2026, 3, 28, 23)),  # spring forward 2026-03-29
    ("*/30 * * * *", ms(BERLIN, 2026, 10, 24, 23)),  # fall back 2026-10-25
    ("30 2 * * *", ms(BERLIN, 2026, 3, 26)),
    ("30 2 * * *", ms(BERLIN, 2026, 10, 22)),
    ("0 1-3 * * *", ms(BERLIN, 2026, 10, 24)),
]


@pytest.mark.parametrize(("cron", "start"), DST_CHANGES)
@pytest.mark.parametrize("spread_s", [0.0, 900.0])
def test_upcoming_is_what_the_poller_fires_across_a_dst_change(
    cron: str, start: int, spread_s: float
) -> None:
    schedule = Schedule("cron", cron=cron, tz=BERLIN, spread_s=spread_s)
    first = schedule.first_due(start)
    assert first is not None
    planned = upcoming(schedule, first, 12, "task-7", now_ms=start)
    assert [(f.due_ms, f.fire_ms) for f in planned] == poller_run(schedule, first, 12, "task-7")
    chain = [first]
    while len(chain) < 12:
        nxt = schedule.next_after(chain[-1])
        assert nxt is not None
        chain.append(nxt)
    assert [f.due_ms for f in planned] == chain
    offset = schedule.offset_ms("task-7")
    assert all(f.fire_ms - f.due_ms == offset for f in planned)
    assert (offset > 0) == (spread_s > 0) and offset < spread_s * 1000 + 1


def test_upcoming_counts_fires_already_made_against_max_runs_and_stops_at_end() -> None:
    capped = Schedule("interval", every_s=60, start_ms=0, max_runs=5)
    assert [f.due_ms for f in upcoming(capped, 180_000, 10, "t", fires_so_far=3)] == [
        180_000,
        240_000,
    ]
    assert upcoming(capped, 300_000, 10, "t", fires_so_far=5) == []
    ended = Schedule("interval", every_s=60, start_ms=0, end_ms=200_000)
    assert [f.due_ms for f in upcoming(ended, 0, 10, "t")] == [0, 60_000, 120_000, 180_000]
    assert upcoming(ended, None, 10, "t") == []


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ("coalesce", [(540_000, 570_000), (600_000, 600_000)]),  # latest missed, now
        ("skip", [(600_000, 600_000), (660_000, 660_000)]),  # next grid time after now
        ("fire_all", [(0, 570_000), (60_000, 570_000)]),  # each missed one, now
    ],
)
def test_an_overdue_task_previews_its_misfire_policy_from_now(
    policy: str, expected: list[tuple[int, int]]
) -> None:
    schedule = Schedule("interval", every_s=60, start_ms=0, misfire=policy)  # type: ignore[arg-type]
    planned = upcoming(schedule, 0, 2, "t", now_ms=570_000)
    assert [(f.due_ms, f.fire_ms) for f in planned] == expected


def test_dst_notes_name_moved_skipped_and_repeated_times() -> None:
    daily = Schedule("cron", cron="30 2 * * *", tz=BERLIN)
    spring = [f.due_ms for f in preview(daily, ms(BERLIN, 2026, 3, 28), 3)]
    notes = dst_notes(daily, spring)
    assert notes[0] is None and notes[2] is None
    assert notes[1] == (
        "02:30 does not exist on 2026-03-29 (clocks go forward): fires at 03:00 instead"
    )
    autumn = [f.due_ms for f in preview(daily, ms(BERLIN, 2026, 10, 24), 3)]
    assert dst_notes(daily, autumn)[1] == (
        "02:30 on 2026-10-25 occurs twice (clocks go back): fires the first time only"
    )
    quarter = Schedule("cron", cron="*/15 * * * *", tz=BERLIN)
    start = ms(BERLIN, 2026, 3, 29, 1, 40)
    table = rows(quarter, preview(quarter, start, 2), start)
    assert table[1]["local"] == "2026-03-29T03:00:00+02:00"
    assert table[1]["note"] == (
        "02:00, 02:15, 02:30, 02:45 do not exist on 2026-03-29 (clocks go forward): no fire then"
    )
    half = Schedule("cron", cron="*/30 * * * *", tz=BERLIN)
    fold = rows(half, preview(half, ms(BERLIN, 2026, 10, 25, 1, 50), 4))
    assert [r["local"][11:] for r in fold] == [
        "02:00:00+02:00", "02:30:00+02:00", "02:00:00+01:00", "02:30:00+01:00"
    ]  # fmt: skip
    assert "fires both times, this is the first" in fold[0]["note"]
    assert "again (UTC+01:00)" in fold[2]["note"]
    interval = Schedule("interval", every_s=3600, tz=BERLIN)
    assert dst_notes(interval, [ms(BERLIN, 2026, 3, 29, 1)]) == [None]


def test_h_picks_the_same_minute_for_a_task_and_different_ones_across_tasks() -> None:
    hashed = Schedule("cron", cron="H H(8-10) * * 1-5", tz=BERLIN)
    check_submitted(hashed, 1.0)
    stored = hashed.for_task("report-1")
    assert stored == hashed.for_task("report-1") and stored.cron is not None
    minute, hour, *rest = stored.cron.split()
    assert 0 <= int(minute) <= 59 and 8 <= int(hour) <= 10 and rest == ["*", "*", "1-5"]
    minutes = {Schedule("cron", cron="H 9 * * *").for_task(f"t{i}").cron for i in range(200)}
    assert len(minutes) > 40  # spread over the hour, not one minute
    assert Schedule("cron", cron="0 9 * * *").for_task("x").cron == "0 9 * * *"
    stepped = resolve_hashed("H/15 H(0-5)/2 * * *", "x").split()
    assert stepped[0].endswith("-59/15") and int(stepped[0].split("-")[0]) < 15
    assert stepped[1].endswith("-5/2") and int(stepped[1].split("-")[0]) < 2
    assert resolve_hashed("0,H 9 * * *", "x").split()[0].startswith("0,")
    assert resolve_hashed("H * * * THU", "x").endswith("THU")


@pytest.mark.parametrize(
    ("cron", "message"),
    [
        ("0 9 H * *", "H is allowed in the minute and hour fields only, not in day-of-month"),
        ("0 9 * * H", "not in day-of-week"),
        ("H(30-10) * * * *", "minute: H(30-10) must be within 0-59"),
        ("H(0-60) * * * *", "minute: H(0-60) must be within 0-59"),
        ("0 H(0-24) * * *", "hour: H(0-24) must be within 0-23"),
        ("H/0 * * * *", "the step of 'H/0' must be within 1..60"),
        ("Hx * * * *", "is not H, H(a-b), H/n or H(a-b)/n"),
    ],
)
def test_h_where_it_is_not_allowed_is_refused_naming_the_field(cron: str, message: str) -> None:
    with pytest.raises(ValueError, match=r"schedule\.cron") as refused:
        Schedule("cron", cron=cron)
    assert message in str(refused.value)


def test_a_preview_of_h_needs_a_task_id() -> None:
    hashed = Schedule("cron", cron="H 9 * * *")
    with pytest.raises(ValueError, match="give one"):
        preview(hashed, 0, 3)
    (first,) = preview(hashed, 0, 1, "daily")
    assert first.due_ms == hashed.for_task("daily").first_due(0)


@pytest.mark.parametrize(
    ("schedule", "refused"),
    [
        (Schedule("interval", every_s=60, spread_s=60), False),
        (Schedule("interval", every_s=60, spread_s=50, jitter_s=11), True),
        (Schedule("cron", cron="*/5 * * * *", spread_s=300), False),
        (Schedule("cron", cron="*/5 * * * *", spread_s=301), True),
        (Schedule("cron", cron="0 9,10 * * *", spread_s=3601), True),  # the 1-hour gap
        (Schedule("cron", cron="H 9 * * *", spread_s=7200), False),
        # H in a list or a stepped range: whatever the id, a time H may take counts (9:01)
        (Schedule("cron", cron="0,H 9 * * *", spread_s=60), False),
        (Schedule("cron", cron="0,H 9 * * *", spread_s=61), True),
        (Schedule("cron", cron="30 0,H * * *", spread_s=3601), True),  # 0:30, then 1:30
        (Schedule("cron", cron="H(0-29)/20 * * * *", spread_s=1201), True),  # 5 and 25
        (Schedule("interval", every_s=60, jitter_s=600), False),  # no spread: no new rule
    ],
)
def test_a_spread_must_end_before_the_next_grid_time(schedule: Schedule, refused: bool) -> None:
    if refused:
        with pytest.raises(ValueError, match=r"schedule\.spread_s: spread_s \+ jitter_s"):
            check_submitted(schedule, 1.0)
    else:
        check_submitted(schedule, 1.0)


def test_a_fire_past_what_a_date_can_say_is_shown_as_its_number() -> None:
    """A one-shot at the last millisecond of year 9999 (valid), moved by its spread into
    year 10000, in a zone ahead of UTC: its row says the numbers, it does not fail (the
    API's upcoming and explain answered 500)."""
    last = 253402300799999
    schedule = Schedule("once", at_ms=last, spread_s=3600, tz="Pacific/Kiritimati")
    (row,) = rows(schedule, preview(schedule, 0, 3, "x"))
    assert row["due"].startswith("9999-12-31T23:59:59")
    assert (row["local"], row["fire"]) == (str(last), str(row["fire_ms"]))


def test_the_score_is_the_spread_fire_time_plus_jitter() -> None:
    schedule = Schedule("interval", every_s=60, spread_s=30, jitter_s=5)
    offset = schedule.offset_ms("abc")
    assert 0 <= offset < 30_000 and offset == schedule.offset_ms("abc")
    assert schedule.fire_ms(1_000, "abc") == 1_000 + offset
    scores = {schedule.score_ms(1_000, "abc") - 1_000 - offset for _ in range(50)}
    assert all(0 <= s <= 5_000 for s in scores) and len(scores) > 1


def test_a_tasks_first_upcoming_fire_notes_the_dst_gap_since_now() -> None:
    """A daily 02:30 job the evening before clocks go forward: its next fire is at 03:00,
    and the task's upcoming list says why."""
    from actors.api.upcoming import task_upcoming
    from actors.domain.model import Task

    schedule = Schedule("cron", cron="30 2 * * *", tz=BERLIN)
    now = ms(BERLIN, 2026, 3, 28, 20)
    first = schedule.first_due(now)
    assert first == ms(BERLIN, 2026, 3, 29, 3)
    task = Task("t", "work", None, schedule, "active", now, now, first, 0, 0, 0, None, None, None)
    (fire, *_) = task_upcoming(task, 2, now)["fires"]
    assert fire["due_ms"] == first
    assert "02:30 does not exist on 2026-03-29" in (fire["note"] or ""), fire


@pytest.mark.parametrize(
    ("late_s", "listed"),
    [(5, [0, 60_000]), (630, [660_000, 720_000])],
)
def test_upcoming_leaves_out_a_fire_its_catch_up_window_expires(
    late_s: int, listed: list[int]
) -> None:
    """A task overdue by ``late_s`` (its poller was down): the coalesced fire its next claim
    makes (the latest grid time missed) is listed while within its catch-up window (10 s),
    and left out past it, as the claim does not run it (noted expired); the grid goes on
    from there either way."""
    from actors.api.upcoming import task_upcoming
    from actors.domain.model import Task

    schedule = Schedule("interval", every_s=60, start_ms=0, catchup_window_s=10)
    now = late_s * 1000
    task = Task("t", "work", None, schedule, "active", 0, 0, 0, 0, 0, 0, None, None, None)
    assert [f["due_ms"] for f in task_upcoming(task, 2, now)["fires"]] == listed
