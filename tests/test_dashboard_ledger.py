"""The dashboard on the occurrence ledger and selector actions, in Chromium against a real
node: a task's history on its page, the attention tab (filters, the link to the task page,
acknowledging with a note), the task list narrowed to tasks needing attention, and "act on
all matching" (a dry run's count and sample, then the same selector applied). Each is
checked against what the API reports afterwards."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from actors.admin.client import Client
from tests.api_node import ADMIN, WORK_AND_DOOMED, ApiNode, recording_api_node, unique, wait_until
from tests.dashboard_browser import needs_chromium, sign_in

pytestmark = needs_chromium
YEARLY = {"kind": "cron", "cron": "0 0 1 1 *"}


@pytest.fixture(scope="module")
def api(
    redis_url: str, tmp_path_factory: pytest.TempPathFactory, record_file: Path
) -> Iterator[ApiNode]:
    with recording_api_node(
        redis_url, tmp_path_factory.mktemp("dashledger"), "dledger", record_file,
        consumers=WORK_AND_DOOMED,
    ) as node:  # fmt: skip
        yield node


def wait_text(page: Any, selector: str, text: str) -> None:
    page.wait_for_function(
        "([sel, text]) => document.querySelector(sel) &&"
        " document.querySelector(sel).textContent.includes(text)",
        arg=[selector, text],
    )


def until_shown(
    page: Any, refresh: Callable[[], None], selector: str, timeout_s: float = 30
) -> Any:
    """Refresh the view until ``selector`` is on it: a fire's fate is written when the fire
    ends, a moment after what the test waited on."""
    from playwright.sync_api import TimeoutError as NotYet

    deadline = time.monotonic() + timeout_s
    while True:
        refresh()
        try:
            page.locator(selector).first.wait_for(state="attached", timeout=1_000)
            return page.locator(selector)
        except NotYet:
            if time.monotonic() > deadline:
                raise


def dead_task(client: Client) -> str:
    """A task of ``doomed`` (fails at once, one attempt) whose one fire is dead-lettered."""
    task_id = unique("doom")
    client.create_task("doomed", {"kind": "once", "at_ms": int(time.time() * 1000)}, None, task_id)

    def dead() -> bool:
        letters = client.dead_letters("doomed", limit=200)["dead_letters"]
        return any(d["task_id"] == task_id for d in letters)

    wait_until(dead, 30)
    return task_id


def attention_ids(client: Client, **params: Any) -> set[str]:
    page = client.request("GET", "/v1/attention", params={"limit": 500, **params})
    return {item["task_id"] for item in page["items"]}


def search(page: Any, task_id: str) -> Callable[[], None]:
    def refresh() -> None:
        page.fill("#task-id", task_id)
        page.click("#task-search button")

    return refresh


def test_the_task_page_shows_the_history(
    page: Any, api: ApiNode, client: Client, record_file: Path
) -> None:
    worked = unique("hist")
    client.create_task("work", YEARLY, None, worked)
    client.trigger(worked)

    def ran() -> bool:
        lines = record_file.read_text().splitlines() if record_file.exists() else []
        return any(json.loads(line)["task_id"] == worked for line in lines)

    wait_until(ran, 30)
    doomed = dead_task(client)
    sign_in(page, api, ADMIN)
    page.click('#tabs button[data-view="tasks"]')
    row = until_shown(page, search(page, worked), '#history-table tr[data-fate="ok"]')
    assert row.get_attribute("data-origin") == "trigger"
    assert "ok" in row.inner_text()
    row = until_shown(page, search(page, doomed), '#history-table tr[data-fate="dead"]')
    assert "never going to work" in row.inner_text()
    assert page.locator("#history-missing").count() == 0


def test_attention_lists_a_dead_task_links_to_it_and_acknowledges_it(
    page: Any, api: ApiNode, client: Client
) -> None:
    doomed = dead_task(client)
    wait_until(lambda: doomed in attention_ids(client, type="doomed"), 30)
    sign_in(page, api, ADMIN)
    page.click('#tabs button[data-view="attention"]')
    page.fill("#att-type", "doomed")
    page.select_option("#att-reason", "dead")
    row = until_shown(
        page, lambda: page.click("#attention-filter button"), f'#attention tr[data-task="{doomed}"]'
    )
    assert row.get_attribute("data-reason") == "dead"
    assert "never going to work" in row.inner_text()
    # The type filter narrows: another type's list does not have it.
    page.fill("#att-type", "work")
    page.click("#attention-filter button")
    page.wait_for_function(
        "(id) => !document.querySelector(`#attention tr[data-task='${id}']`)", arg=doomed
    )
    page.fill("#att-type", "doomed")
    page.click("#attention-filter button")
    row.wait_for()

    row.locator("a.task-link").click()  # the task's page
    page.wait_for_function(
        "(id) => document.querySelector('#task-title').textContent.startsWith(id + ' ')",
        arg=doomed,
    )
    assert page.locator("#view-tasks").is_visible()

    page.click('#tabs button[data-view="attention"]')
    row.wait_for()
    row.locator("input.ack-note").fill("known: the handler is a test's")
    row.locator("button.ack").click()
    row.wait_for(state="detached")
    assert doomed not in attention_ids(client, type="doomed")
    assert page.locator("#error").is_hidden()


def test_the_task_list_narrows_to_tasks_needing_attention(
    page: Any, api: ApiNode, client: Client
) -> None:
    case = f"c{time.monotonic_ns() % 10**9}"
    quiet = unique("quiet")
    client.create_task("work", YEARLY, None, quiet, labels={"case": case})
    doomed = unique("doom")
    client.create_task("doomed", {"kind": "once", "at_ms": int(time.time() * 1000)}, None,
                       doomed, labels={"case": case})  # fmt: skip
    wait_until(lambda: doomed in attention_ids(client), 30)
    sign_in(page, api, ADMIN)
    page.click('#tabs button[data-view="tasks"]')
    page.fill("#list-labels", f"case={case}")
    page.click("#task-list button")
    page.locator(f'#tasks tr[data-task="{quiet}"]').wait_for()
    page.locator(f'#tasks tr[data-task="{doomed}"]').wait_for()
    page.select_option("#list-attention", "any")
    page.click("#task-list button")
    page.locator(f'#tasks tr[data-task="{quiet}"]').wait_for(state="detached")
    assert page.locator("#tasks tbody tr").count() == 1
    assert page.locator(f'#tasks tr[data-task="{doomed}"]').is_visible()
    # A selector cannot say "needs attention": acting on all matching refuses, and says why.
    page.click("#bulk-dry")
    wait_text(page, "#error", "attention filter is not part of a selector")
    # The latest fate narrows the list too (the API's last_fate filter).
    page.select_option("#list-attention", "")
    page.select_option("#list-fate", "dead")
    page.click("#task-list button")
    page.locator(f'#tasks tr[data-task="{quiet}"]').wait_for(state="detached")
    assert page.locator(f'#tasks tr[data-task="{doomed}"]').is_visible()


def test_a_filter_edited_after_a_dry_run_asks_for_another_before_apply(
    page: Any, api: ApiNode, client: Client
) -> None:
    """A dry run's Apply is for the filters it was made with: once one is edited, Apply
    is gone until a dry run of what the form now shows (it applied the old selector)."""
    kind = f"edit{time.monotonic_ns() % 10**9}"  # no consumer: its tasks only list
    for i, tenant in enumerate(("acme", "beta")):
        client.create_task(kind, YEARLY, None, f"{kind}-{i}", labels={"tenant": tenant})
    sign_in(page, api, ADMIN)
    page.click('#tabs button[data-view="tasks"]')
    page.fill("#list-type", kind)
    page.fill("#list-labels", "tenant=acme")
    page.select_option("#bulk-action", "pause")
    page.click("#bulk-dry")
    wait_text(page, "#bulk-apply", "Apply pause to 1 task")
    page.fill("#list-labels", "tenant=beta")
    assert page.locator("#bulk-apply").is_hidden()
    page.select_option("#list-status", "active")
    assert page.locator("#bulk-apply").is_hidden()
    assert {client.get_task(f"{kind}-{i}")["status"] for i in range(2)} == {"active"}


def test_act_on_all_matching_shows_a_dry_run_then_applies_it(
    page: Any, api: ApiNode, client: Client
) -> None:
    kind = f"sel{time.monotonic_ns() % 10**9}"  # no consumer: its tasks only list
    ids = [f"{kind}-{i}" for i in range(3)]
    for task_id, tenant in zip(ids, ("acme", "acme", "beta"), strict=True):
        client.create_task(kind, YEARLY, None, task_id, labels={"tenant": tenant})
    sign_in(page, api, ADMIN)
    page.click('#tabs button[data-view="tasks"]')
    page.fill("#list-type", kind)
    page.fill("#list-labels", "tenant=acme")
    page.select_option("#bulk-action", "pause")
    page.fill("#bulk-note", "maintenance window")
    page.click("#bulk-dry")
    wait_text(page, "#bulk-preview", "2 tasks match")
    preview = page.locator("#bulk-preview").inner_text()
    assert ids[0] in preview and ids[1] in preview and ids[2] not in preview
    assert page.locator("#tasks tbody tr").count() == 2  # the list shows the selector's tasks
    assert all(client.get_task(i)["status"] == "active" for i in ids)  # a dry run changes nothing
    assert page.locator("#bulk-apply").inner_text() == "Apply pause to 2 tasks"
    page.click("#bulk-apply")
    wait_text(page, "#bulk-preview", "2 changed")
    for task_id in ids[:2]:
        task = client.get_task(task_id)
        assert task["status"] == "paused" and task["note"]["note"] == "maintenance window"
    assert client.get_task(ids[2])["status"] == "active"
    page.wait_for_function(
        "() => [...document.querySelectorAll('#tasks tbody td.status')]"
        ".every((td) => td.textContent === 'paused')"
    )

    # Trigger on the same selector: a fire of each, queued (no consumer reads this type).
    page.select_option("#bulk-action", "trigger")
    page.click("#bulk-dry")
    wait_text(page, "#bulk-apply", "Apply trigger to 2 tasks")
    page.click("#bulk-apply")
    wait_text(page, "#bulk-preview", "trigger: 2 matched")
    wait_until(lambda: client.queues(kind)["undelivered"] == 2)

    # The answer to an apply lost on its way back (the action ran): the plan stays, and
    # Apply clicked again sends the same action id, which answers that action's counts
    # rather than triggering each task a second time.
    lost: list[str] = []

    def lose_the_answer(route: Any) -> None:
        body = route.request.post_data or ""
        if not lost and '"dry_run":false' in body.replace(" ", ""):
            lost.append(body)
            route.fetch()  # the node applies it; its answer never reaches the page
            route.abort()
        else:
            route.continue_()

    page.route("**/v1/tasks/actions", lose_the_answer)
    page.click("#bulk-dry")
    wait_text(page, "#bulk-apply", "Apply trigger to 2 tasks")
    page.click("#bulk-apply")
    page.wait_for_selector("#error", state="visible")
    wait_until(lambda: client.queues(kind)["undelivered"] == 4)
    assert page.locator("#bulk-apply").is_visible()
    page.click("#bulk-apply")
    wait_text(page, "#bulk-preview", "trigger: 2 matched")
    assert lost and client.queues(kind)["undelivered"] == 4  # not 6: applied once
