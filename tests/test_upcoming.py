"""Upcoming fires and schedule previews end to end: a real node runs a spread task and its
handler's calls are the fires ``GET /v1/tasks/{task_id}/upcoming`` listed; explain shows the
next three; the CLI's ``tasks upcoming`` and ``schedule preview`` (local, no node)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from actors.admin.client import ApiError, Client
from tests.api_node import WORK_AND_DOOMED, ApiNode, recording_api_node, wait_until
from tests.cli_runner import run_in_process
from tests.test_api import records
from tests.test_cli import ok_json, run


@pytest.fixture(scope="module")
def api(
    redis_url: str, tmp_path_factory: pytest.TempPathFactory, record_file: Path
) -> Iterator[ApiNode]:
    with recording_api_node(
        redis_url,
        tmp_path_factory.mktemp("upcoming"),
        "upcoming",
        record_file,
        consumers=WORK_AND_DOOMED,
    ) as node:
        yield node


def test_the_fires_a_node_runs_are_the_ones_upcoming_listed(
    client: Client, record_file: Path
) -> None:
    start = int(time.time() * 1000) + 2_000
    schedule = {"kind": "interval", "every_s": 1, "start_ms": start, "spread_s": 0.6}
    client.create_task("work", schedule, None, "spread-run")
    listed = client.upcoming("spread-run", n=3)
    assert listed["status"] == "active" and listed["notes"] == []
    fires = listed["fires"]
    offset = listed["offset_ms"]
    assert [f["due_ms"] for f in fires] == [start, start + 1000, start + 2000]
    assert all(f["fire_ms"] == f["due_ms"] + offset for f in fires)
    facts = client.explain("spread-run")
    assert [f["due_ms"] for f in facts["upcoming"]] == [f["due_ms"] for f in fires]
    assert any(line.startswith("next fires: ") for line in facts["summary"])

    ran = wait_until(lambda: len(r := records(record_file, "spread-run")) >= 3 and r, 30)
    assert [r["due_ms"] for r in ran[:3]] == [f["due_ms"] for f in fires]
    for record, fire in zip(ran[:3], fires, strict=True):
        assert record["schedule_id"] == f"spread-run:{fire['due_ms']}"
        assert record["t_ms"] >= fire["fire_ms"]  # run no earlier than the preview said


def test_a_task_that_is_not_active_has_no_upcoming_fires_and_says_why(client: Client) -> None:
    later = {"kind": "interval", "every_s": 3600, "start_ms": 4102444800000, "jitter_s": 5}
    client.create_task("work", later, None, "resting")
    active = client.upcoming("resting")
    assert len(active["fires"]) == 10
    assert any("jitter of up to 5s" in note for note in active["notes"])
    client.pause("resting")
    paused = client.upcoming("resting")
    assert paused["status"] == "paused" and paused["fires"] == []
    assert paused["notes"][0].startswith("paused: no fires until resumed")
    capped = {"kind": "interval", "every_s": 3600, "start_ms": 4102444800000, "max_runs": 2}
    client.create_task("work", capped, None, "capped")
    two = client.upcoming("capped", n=5)
    assert len(two["fires"]) == 2 and two["notes"] == ["its schedule ends after 2 more fire(s)"]
    for bad in ("0", "1001", "x"):
        with pytest.raises(ApiError) as refused:
            client.request("GET", "/v1/tasks/capped/upcoming", params={"n": bad})
        assert refused.value.status == 422 and "n: must be an integer" in refused.value.detail
    with pytest.raises(ApiError) as missing:
        client.upcoming("no-such-task")
    assert missing.value.status == 404


def test_h_is_resolved_from_the_id_and_h_where_it_is_not_allowed_is_refused(
    client: Client,
) -> None:
    client.create_task("work", {"kind": "cron", "cron": "H 9 * * *"}, None, "hashed")
    cron = client.get_task("hashed")["schedule"]["cron"]
    minute, rest = cron.split(" ", 1)
    assert 0 <= int(minute) <= 59 and rest == "9 * * *"
    with pytest.raises(ApiError) as refused:
        client.create_task("work", {"kind": "cron", "cron": "0 9 H * *"}, None, "bad-h")
    assert refused.value.status == 422
    assert "minute and hour fields only" in refused.value.detail


def test_the_cli_lists_a_tasks_upcoming_fires(api: ApiNode, client: Client) -> None:
    later = {"kind": "cron", "cron": "30 2 * * *", "tz": "Europe/Berlin",
             "start_ms": 4102444800000}  # fmt: skip
    client.create_task("work", later, None, "cli-upcoming")
    answer = ok_json(api, "tasks", "upcoming", "cli-upcoming", "-n", "2")
    assert [f["local"][11:] for f in answer["fires"]] == ["02:30:00+01:00"] * 2
    table = run(api, "tasks", "upcoming", "cli-upcoming", "-n", "2")
    assert table.returncode == 0 and "LOCAL (Europe/Berlin)" in table.stdout
    assert run(api, "tasks", "upcoming", "cli-upcoming", "-n", "0").returncode == 2


def preview(*args: str) -> subprocess.CompletedProcess[str]:
    """``metronome schedule preview`` with no credentials and no node: it is local."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("METRONOME_")}
    return run_in_process(list(args), env)


def test_schedule_preview_is_local_and_marks_dst_changes() -> None:
    berlin = ("--cron", "30 2 * * *", "--tz", "Europe/Berlin")
    done = preview("--json", "schedule", "preview", *berlin,
                   "--from", "2026-03-28T00:00:00+01:00", "-n", "3")  # fmt: skip
    assert done.returncode == 0, done.stderr
    answer: dict[str, Any] = json.loads(done.stdout)
    assert [f["local"] for f in answer["fires"]] == [
        "2026-03-28T02:30:00+01:00", "2026-03-29T03:00:00+02:00", "2026-03-30T02:30:00+02:00"
    ]  # fmt: skip
    assert answer["fires"][1]["note"].startswith("02:30 does not exist on 2026-03-29")
    table = preview("schedule", "preview", *berlin, "--from", "2026-10-24T00:00:00+02:00")
    assert table.returncode == 0 and "occurs twice" in table.stdout
    hashed = preview("schedule", "preview", "--cron", "H 9 * * *")
    assert hashed.returncode == 5 and "task id" in hashed.stderr
    with_id = preview("--json", "schedule", "preview", "--cron", "H 9 * * *", "--id", "daily",
                      "--spread", "60", "-n", "1")  # fmt: skip
    answer = json.loads(with_id.stdout)
    assert "H" not in answer["schedule"]["cron"] and 0 <= answer["offset_ms"] < 60_000
    (fire,) = answer["fires"]
    assert fire["fire_ms"] == fire["due_ms"] + answer["offset_ms"]
    assert preview("schedule", "preview", "--every", "60", "-n", "0").returncode == 2
    assert preview("schedule", "preview").returncode == 2
    # Unix seconds given for ms would name January 1970 (a one-shot due at once, a
    # backfill of 1970): refused, saying how to write it.
    seconds = preview("schedule", "preview", "--every", "60", "--from", "1767225600")
    assert seconds.returncode == 2 and "looks like Unix seconds" in seconds.stderr
    assert "1767225600000" in seconds.stderr
    in_ms = preview("schedule", "preview", "--every", "60", "--from", "1767225600000", "-n", "1")
    assert in_ms.returncode == 0, in_ms.stderr
