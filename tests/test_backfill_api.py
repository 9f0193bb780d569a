"""Backfill over HTTP against a real node and a real Redis: the fires a backfill appends
are the ones the poller ran (same schedule ids) and they run again, once however often the
backfill is repeated; refusals write nothing; the by-type form. The store's grid
computations: test_backfill.py; the CLI: test_cli.py."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from actors.admin.client import ApiError, Client
from actors.store.keys import Keys
from tests.api_node import WORK_AND_DOOMED, ApiNode, recording_api_node, unique, wait_until

HOUR = 3_600_000
SETTINGS = 'task_types = ["work", "doomed", "idle"]\nbackfill_max_fires = 2000'


@pytest.fixture(scope="module")
def api(
    redis_url: str, tmp_path_factory: pytest.TempPathFactory, record_file: Path
) -> Iterator[ApiNode]:
    with recording_api_node(
        redis_url,
        tmp_path_factory.mktemp("backfill"),
        "backfill",
        record_file,
        consumers=WORK_AND_DOOMED,
        api_extra=SETTINGS,
    ) as node:
        yield node


def ran(path: Path, task_id: str) -> list[str]:
    """The schedule ids the handler ran for this task, in the order it ran them."""
    if not path.exists():
        return []
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [x["schedule_id"] for x in lines if x["task_id"] == task_id]


def now_ms(db: redis.Redis) -> int:
    seconds, micros = db.time()
    return int(seconds) * 1000 + int(micros) // 1000


def test_a_backfill_runs_again_the_fires_the_poller_ran_and_only_once(
    client: Client, record_file: Path
) -> None:
    task_id = unique("every-second")
    client.create_task("work", {"kind": "interval", "every_s": 1}, {"n": 1}, task_id)
    wait_until(lambda: len(ran(record_file, task_id)) >= 3, 30)
    client.pause(task_id)
    original = sorted(set(ran(record_file, task_id)))
    dues = [int(sid.rsplit(":", 1)[1]) for sid in original]
    before = client.get_task(task_id)
    window = (dues[0], dues[-1] + 1)

    dry = client.backfill(task_id, *window, dry_run=True)
    assert [f["schedule_id"] for f in dry["fires"]] == original
    assert [f["due_ms"] for f in dry["fires"]] == dues
    assert (dry["enqueued"], dry["already_backfilled"], dry["dry_run"]) == (0, 0, True)
    assert dry["overlap"] == "allow_all" and dry["type"] == "work"

    done = client.backfill(task_id, *window)
    assert (done["enqueued"], done["already_backfilled"]) == (len(original), 0)
    wait_until(lambda: sorted(ran(record_file, task_id)) == sorted(original * 2), 30)
    again = client.backfill(task_id, *window, overlap="skip")
    # Every grid time was taken by the backfill before: none is decided again.
    assert (again["enqueued"], again["already_backfilled"], again["held_back"]) == (
        0, len(original), 0,
    )  # fmt: skip
    assert again["overlap"] == "skip"
    flight = client.explain(task_id)["flight"]
    assert flight is None or flight["in_flight_due_ms"] is None
    after = client.get_task(task_id)
    assert (after["next_run_ms"], after["fires"]) == (before["next_run_ms"], before["fires"])
    time.sleep(0.5)  # nothing more runs: the backfill appended each fire once
    assert sorted(ran(record_file, task_id)) == sorted(original * 2)


def test_refused_backfills_name_the_field_and_write_nothing(
    client: Client, db: redis.Redis, keys: Keys
) -> None:
    task_id = unique("idle")
    other = client.create_task("idle", {"kind": "interval", "every_s": 1})["task_id"]
    client.create_task("idle", {"kind": "interval", "every_s": 1}, None, task_id)
    now = now_ms(db)
    cases: list[tuple[dict[str, Any], int, str, str]] = [
        ({"start_ms": now - HOUR, "end_ms": now + HOUR}, 422, "end_ms", "in the future"),
        ({"start_ms": now, "end_ms": now - HOUR}, 422, "end_ms", "after start_ms"),
        ({"start_ms": now - 24 * HOUR, "end_ms": now}, 422, "end_ms", "86400 fires"),
        ({"start_ms": now - HOUR, "end_ms": now, "overlap": "later"}, 422, "overlap", "one of"),
        ({"start_ms": now - HOUR, "end_ms": now, "colour": 1}, 422, "", "colour"),
        ({"start_ms": "yesterday", "end_ms": now}, 422, "start_ms", "int"),
        ({"end_ms": now}, 422, "start_ms", "required"),
    ]
    for body, status, field, text in cases:
        with pytest.raises(ApiError) as refused:
            client.request("POST", f"/v1/tasks/{task_id}/backfill", body=body)
        assert refused.value.status == status, body
        if field:  # (an unknown key is named in the detail)
            assert refused.value.errors[0]["field"] == field, refused.value.errors
        assert text in refused.value.detail, refused.value.detail
    with pytest.raises(ApiError, match="the 2000 one backfill may enqueue") as capped:
        client.backfill(task_id, now - 24 * HOUR, now)
    assert "backfill_max_fires" in capped.value.detail
    with pytest.raises(ApiError) as missing:
        client.backfill(unique("nobody"), now - HOUR, now)
    assert missing.value.status == 404
    with pytest.raises(ApiError) as whole:
        client.backfill_type("idle", now - HOUR, now)  # 2 x 3600 fires: more than 2000
    assert whole.value.status == 422 and "more than 2000 fires" in whole.value.detail
    with pytest.raises(ApiError) as undeclared:
        client.backfill_type("elsewhere", now - HOUR, now)
    assert undeclared.value.status == 422 and "unknown task type" in undeclared.value.detail
    client.stop(task_id)
    with pytest.raises(ApiError) as stopped:
        client.backfill(task_id, now - 60_000, now)
    assert stopped.value.status == 409
    assert not db.exists(keys.backfilled("idle", task_id))  # (the poller fills the stream)
    client.delete_task(other)


def test_a_type_backfill_covers_its_active_and_paused_tasks(
    client: Client, db: redis.Redis, keys: Keys
) -> None:
    kind = "doomed"  # no fire of it runs long: each goes to the DLQ at once
    hourly = {"kind": "cron", "cron": "0 * * * *", "tz": "Europe/Paris"}
    ids = {name: unique(f"hourly-{name}") for name in ("active", "paused", "stopped")}
    for task_id in ids.values():
        client.create_task(kind, hourly, None, task_id)
    client.pause(ids["paused"])
    client.stop(ids["stopped"])
    now = now_ms(db)
    start, end = now - now % HOUR - 3 * HOUR, now - now % HOUR
    dry = client.backfill_type(kind, start, end, dry_run=True)
    mine = {t["task_id"]: t for t in dry["tasks"] if t["task_id"] in ids.values()}
    assert set(mine) == {ids["active"], ids["paused"]}
    assert {t["fires"] for t in mine.values()} == {3} and dry["enqueued"] == 0
    done = client.backfill_type(kind, start, end)
    assert done["fires"] == done["enqueued"] + done["already_backfilled"] == dry["fires"]
    counted = {t["task_id"]: t["enqueued"] for t in done["tasks"]}
    assert counted[ids["active"]] == counted[ids["paused"]] == 3
    # They ran (and, being doomed, were dead-lettered), under the grid's schedule ids.
    expected = {f"{ids[n]}:{start + k * HOUR}" for n in ("active", "paused") for k in range(3)}

    def dead_ids() -> set[str]:
        entries: Any = db.xrange(keys.dlq(kind))
        return {f[b"schedule_id"].decode() for _, f in entries} & expected

    wait_until(lambda: dead_ids() == expected, 30)
    again = client.backfill_type(kind, start, end)
    assert again["enqueued"] == 0 and again["already_backfilled"] == done["fires"]
