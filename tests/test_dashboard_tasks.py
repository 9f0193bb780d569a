"""The dashboard operates tasks: the task list and its filters, the task page and each of
its actions (pause with a note, resume, stop, trigger, backfill after a dry run), driven in
Chromium against a real node whose handlers record what they ran. Each action is checked
by what the API (or the handler's record) reports afterwards, not by what the page says.
A read-only key gets no action controls, and a write forced past that is refused cleanly.
Endpoints a node may not have yet answer 404 here (intercepted): the page says "not
available" and keeps working."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from actors.admin.client import Client
from actors.store.keys import Keys
from tests.api_node import (
    ADMIN,
    READER,
    WORK_AND_DOOMED,
    ApiNode,
    recording_api_node,
    unique,
    wait_until,
)
from tests.dashboard_browser import needs_chromium, sign_in

pytestmark = needs_chromium
YEARLY = {"kind": "cron", "cron": "0 0 1 1 *"}
#: A moment as the page shows it: UTC ISO 8601, then how far from now.
SHOWN_TIME = re.compile(
    r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ \((in \d+ (s|min|h|d)|\d+ (s|min|h|d) ago|now)\)$"
)


@pytest.fixture(scope="module")
def api(
    redis_url: str, tmp_path_factory: pytest.TempPathFactory, record_file: Path
) -> Iterator[ApiNode]:
    with recording_api_node(
        redis_url, tmp_path_factory.mktemp("dashtasks"), "dtask", record_file,
        consumers=WORK_AND_DOOMED,
    ) as node:  # fmt: skip
        yield node


def ran(record_file: Path, task_id: str) -> list[dict[str, Any]]:
    if not record_file.exists():
        return []
    lines = [json.loads(line) for line in record_file.read_text().splitlines() if line]
    return [r for r in lines if r["task_id"] == task_id and r["event"] == "ran"]


def open_task(page: Any, api: ApiNode, key: tuple[str, str], task_id: str) -> None:
    sign_in(page, api, key)
    page.click('#tabs button[data-view="tasks"]')
    page.fill("#task-id", task_id)
    page.click("#task-search button")
    page.wait_for_function(
        "(id) => document.querySelector('#task-title').textContent.startsWith(id + ' ')",
        arg=task_id,
    )


def wait_text(page: Any, selector: str, text: str) -> None:
    page.wait_for_function(
        "([sel, text]) => document.querySelector(sel) &&"
        " document.querySelector(sel).textContent.includes(text)",
        arg=[selector, text],
    )


def test_pause_with_a_note_resume_and_stop_from_the_task_page(
    page: Any, api: ApiNode, client: Client
) -> None:
    task_id = unique("page")
    client.create_task("work", YEARLY, None, task_id, labels={"tenant": "acme"})
    open_task(page, api, ADMIN, task_id)
    facts = page.locator("#task-facts").inner_text()
    assert "tenant=acme" in facts and "cron" in facts
    assert SHOWN_TIME.match(page.locator('dd[data-fact="next-fire"]').inner_text())
    assert page.locator("#upcoming-fires tbody tr").count() == 5
    assert "active: next fire at" in page.locator("#explain").inner_text()

    page.fill("#action-note", "vendor outage")
    page.click("#act-pause")
    task = wait_until(lambda: (t := client.get_task(task_id))["status"] == "paused" and t)
    assert task["note"]["note"] == "vendor outage" and task["note"]["by"] == ADMIN[0]
    wait_text(page, "#task-note", "vendor outage")
    assert "paused" in page.locator("#task-title").inner_text()
    assert "no fires until resumed" in page.locator("#task-upcoming").inner_text()

    page.fill("#action-note", "")
    page.click("#act-resume")
    wait_until(lambda: client.get_task(task_id)["status"] == "active")
    wait_text(page, "#task-title", "active")

    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#act-stop")
    wait_until(lambda: client.get_task(task_id)["status"] == "stopped")
    wait_text(page, "#task-title", "stopped")
    # A refusal is shown as the API's problem details, not swallowed.
    page.click("#act-resume")
    wait_text(page, "#error", "409 invalid_transition")
    assert client.get_task(task_id)["status"] == "stopped"


def test_trigger_from_the_task_page_runs_a_fire(
    page: Any, api: ApiNode, client: Client, record_file: Path
) -> None:
    task_id = unique("trig")
    client.create_task("work", YEARLY, None, task_id)
    open_task(page, api, ADMIN, task_id)
    page.click("#act-trigger")
    wait_text(page, "#action-result", "queued")
    (fire,) = wait_until(lambda: ran(record_file, task_id), 30)
    assert fire["attempt"] == 0
    assert fire["schedule_id"] in page.locator("#action-result").inner_text()


def test_backfill_shows_its_dry_run_then_applies_it(
    page: Any, api: ApiNode, client: Client, record_file: Path
) -> None:
    task_id = unique("fill")
    client.create_task("work", {"kind": "interval", "every_s": 600}, None, task_id)
    # An hour of a ten-minute grid: six grid times, wherever the grid is anchored.
    end_ms = (int(time.time()) // 60 - 2) * 60_000
    start_ms = end_ms - 3_600_000
    open_task(page, api, ADMIN, task_id)
    page.fill("#backfill-start", _utc_input(start_ms))
    page.fill("#backfill-end", _utc_input(end_ms))
    page.click("#backfill-dry")
    wait_text(page, "#backfill-preview", "it would append 6")
    dry = client.backfill(task_id, start_ms, end_ms, dry_run=True)
    assert dry["already_backfilled"] == 0  # the dry run wrote nothing
    assert page.locator("#backfill-apply").inner_text() == "Append 6 fires"
    page.click("#backfill-apply")
    wait_text(page, "#backfill-preview", "6 fires appended")
    assert page.locator("#backfill-apply").is_hidden()
    assert client.backfill(task_id, start_ms, end_ms, dry_run=True)["already_backfilled"] == 6

    # The six ran (the task's own first fire, after the window, aside).
    def backfilled() -> list[int]:
        return sorted(r["due_ms"] for r in ran(record_file, task_id) if r["due_ms"] < end_ms)

    wait_until(lambda: len(backfilled()) >= 6, 30)
    assert backfilled() == [f["due_ms"] for f in dry["fires"]]


def _utc_input(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def listed(page: Any) -> set[str]:
    return set(
        page.eval_on_selector_all("#tasks tbody tr", "rows => rows.map(r => r.dataset.task)")
    )


def relist(page: Any, expected: set[str]) -> None:
    page.click("#task-list button")
    page.wait_for_function(
        "(ids) => { const rows = [...document.querySelectorAll('#tasks tbody tr')];"
        " return rows.length === ids.length && rows.every((r) => ids.includes(r.dataset.task)); }",
        arg=sorted(expected),
    )


def test_filters_narrow_the_list_and_pages_follow_the_cursor(
    page: Any, api: ApiNode, client: Client
) -> None:
    kind = f"flt{time.monotonic_ns() % 10**9}"  # no consumer: its tasks only list
    acme, beta, held = (f"{kind}-{name}" for name in ("acme", "beta", "held"))
    client.create_task(kind, YEARLY, None, acme, labels={"tenant": "acme", "env": "prod"})
    client.create_task(kind, YEARLY, None, beta, labels={"tenant": "beta", "env": "prod"})
    client.create_task(kind, YEARLY, None, held, labels={"tenant": "acme", "env": "dev"})
    client.pause(held)
    sign_in(page, api, ADMIN)
    page.click('#tabs button[data-view="tasks"]')
    page.fill("#list-type", kind)
    relist(page, {acme, beta, held})
    row = page.locator(f'#tasks tr[data-task="{acme}"]')
    assert row.locator("td.labels").inner_text() == "env=prod tenant=acme"
    assert SHOWN_TIME.match(row.locator("td").nth(4).inner_text())
    page.fill("#list-labels", "tenant=acme")
    relist(page, {acme, held})
    page.fill("#list-labels", "tenant=acme env=prod")
    relist(page, {acme})
    page.fill("#list-labels", "")
    page.select_option("#list-status", "paused")
    relist(page, {held})
    page.fill("#list-labels", "tenant")  # not key=value: said, not sent
    page.click("#task-list button")
    wait_text(page, "#error", 'labels: "tenant" is not key=value')

    # More tasks than a page: "Next page" follows the API's cursor to the rest.
    many = f"pg{time.monotonic_ns() % 10**9}"
    ids = {f"{many}-{i}" for i in range(60)}
    client.create_tasks([{"type": many, "schedule": YEARLY, "task_id": i} for i in ids])
    page.fill("#list-labels", "")
    page.select_option("#list-status", "")
    page.fill("#list-type", many)
    page.click("#task-list button")
    page.locator("#list-next").wait_for()
    seen: set[str] = set()
    while True:
        shown = listed(page)
        seen |= shown
        if page.locator("#list-next").is_hidden():
            break
        page.click("#list-next")
        page.wait_for_function(
            "(ids) => ![...document.querySelectorAll('#tasks tbody tr')]"
            ".some((r) => ids.includes(r.dataset.task))",
            arg=sorted(shown),
        )
    assert seen == ids
    assert page.locator("#list-prev").is_visible()


def test_a_rare_status_shows_though_the_first_pages_of_it_are_empty(
    page: Any, api: ApiNode, client: Client
) -> None:
    """More tasks of a type than one listing request reads, one of them paused, the last
    the listing reaches: the API's first page of paused tasks is empty with a cursor, and
    the page reads on until it finds the paused one."""
    kind = f"rare{time.monotonic_ns() % 10**9}"  # no consumer: its tasks only list
    for chunk in range(3):
        client.create_tasks([{"type": kind, "schedule": YEARLY, "task_id": f"{kind}-{chunk}-{i}"}
                             for i in range(4000)])  # fmt: skip
    last = [task["task_id"] for task in client.iter_tasks(kind)][-1]
    client.pause(last)
    first = client.list_tasks(kind, "paused")
    assert first["tasks"] == [] and first["next_cursor"]  # the case this test is about
    sign_in(page, api, ADMIN)
    page.click('#tabs button[data-view="tasks"]')
    page.fill("#list-type", kind)
    page.select_option("#list-status", "paused")
    relist(page, {last})


def test_a_task_whose_records_cannot_be_read_is_named_under_the_list(
    page: Any, api: ApiNode, client: Client, db: Any, keys: Keys
) -> None:
    kind = f"brk{time.monotonic_ns() % 10**9}"  # no consumer: its tasks only list
    good, broken = f"{kind}-good", f"{kind}-broken"
    client.create_tasks([{"type": kind, "schedule": YEARLY, "task_id": t} for t in (good, broken)])
    definitions = keys.definitions(keys.partition_of(broken), keys.bucket_of(broken))
    db.hset(definitions, broken, b"\xc1 not MessagePack")
    try:
        sign_in(page, api, ADMIN)
        page.click('#tabs button[data-view="tasks"]')
        page.fill("#list-type", kind)
        relist(page, {good})
        wait_text(page, "#list-status-line", f"Stored records that cannot be read: {broken}.")
    finally:
        client.delete_task(broken)


def test_a_read_only_key_sees_no_actions_and_a_forced_write_is_refused(
    page: Any, api: ApiNode, client: Client
) -> None:
    task_id = unique("ro")
    client.create_task("work", YEARLY, None, task_id)
    open_task(page, api, READER, task_id)
    assert page.locator("#explain li").first.is_visible()  # reading is allowed
    for control in ("#task-actions", "#act-pause", "#act-trigger", "#backfill-dry", "#bulk"):
        assert page.locator(control).is_hidden(), control
    # Forced: the controls shown anyway, and used. The API refuses, and the page says so.
    page.evaluate("() => document.body.classList.remove('read-only')")
    page.click("#act-pause")
    wait_text(page, "#error", "403 read_only")
    assert client.get_task(task_id)["status"] == "active"


def _missing(route: Any) -> None:
    route.fulfill(
        status=404, content_type="application/problem+json",
        body=json.dumps({"status": 404, "code": "no_route", "detail": "no such endpoint"}),
    )  # fmt: skip


def test_endpoints_a_node_lacks_show_as_not_available(
    page: Any, api: ApiNode, client: Client
) -> None:
    task_id = unique("old")
    client.create_task("work", YEARLY, None, task_id)
    for pattern in ("**/v1/tasks/*/history*", "**/v1/attention*", "**/v1/tasks/actions"):
        page.route(pattern, _missing)
    open_task(page, api, ADMIN, task_id)
    assert "not available" in page.locator("#history-missing").inner_text()
    assert page.locator("#explain li").first.is_visible()
    page.fill("#list-type", "work")
    page.click("#bulk-dry")
    wait_text(page, "#bulk-preview", "not available on this node")
    assert page.locator("#bulk-apply").is_hidden()
    page.select_option("#list-attention", "any")
    page.click("#task-list button")
    wait_text(page, "#list-status-line", "not available on this node")
    page.click('#tabs button[data-view="attention"]')
    wait_text(page, "#attention-status", "not available on this node")
    assert page.locator("#error").is_hidden()
