"""The dashboard in a real browser: Debian's Chromium, driven by Playwright, against a real
node. The page signs its own requests (WebCrypto), so these tests also prove the browser
side of the signature scheme; they run under the node's Content-Security-Policy (so a
``wait_for_function`` takes a function: the policy forbids evaluating a string). Skipped,
saying why, only where no Chromium is installed (`.ci/run` installs it)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from actors.admin.client import Client
from tests.api_node import (
    ADMIN,
    READER,
    WORK_AND_DOOMED,
    ApiNode,
    api_node,
    wait_until,
    write_api_config,
)
from tests.dashboard_browser import needs_chromium, sign_in
from tests.error_texts import EXAMPLES
from tests.node_process import REPO
from tests.waiting import until

pytestmark = needs_chromium


@pytest.fixture(scope="module")
def api(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiNode]:
    namespace = f"dash{time.monotonic_ns() % 10**9}"
    config = write_api_config(
        tmp_path_factory.mktemp("dash") / "node.toml", redis_url, namespace,
        consumers=WORK_AND_DOOMED,
    )  # fmt: skip
    with api_node(config, namespace) as node:
        yield node


def test_the_queue_table_shows_the_backlog_a_test_created(page: Any, api: ApiNode) -> None:
    kind = f"orphan{time.monotonic_ns() % 10**6}"  # no node consumes it: it only queues
    with Client(api.url, *ADMIN) as client:
        for i in range(3):
            client.create_task(kind, {"kind": "cron", "cron": "0 0 1 1 *"}, None, f"{kind}-{i}")
            client.trigger(f"{kind}-{i}")
    sign_in(page, api, ADMIN)
    backlog = page.locator(f'#queues tr[data-type="{kind}"] td.backlog')
    backlog.wait_for()
    assert backlog.inner_text() == "3"
    assert page.locator("#who").inner_text() == ADMIN[0]
    # Purging the backlog from the page (a write, confirmed in a dialog) empties it.
    page.on("dialog", lambda dialog: dialog.accept())
    page.locator(f'#queues tr[data-type="{kind}"] button').click()
    page.wait_for_function(  # a function, not an expression: the page's policy forbids eval
        f"() => document.querySelector('#queues tr[data-type=\"{kind}\"] td.backlog')"
        ".textContent === '0'"
    )
    with Client(api.url, *ADMIN) as client:
        assert client.queues(kind)["undelivered"] == 0


def test_a_dead_letter_replayed_from_the_page_runs_again(page: Any, api: ApiNode) -> None:
    task_id = f"dash-{time.monotonic_ns()}"
    with Client(api.url, *ADMIN) as client:
        client.create_task("doomed", {"kind": "once", "at_ms": int(time.time() * 1000)}, None,
                           task_id)  # fmt: skip
        first = _dead_letter_of(client, task_id)
    sign_in(page, api, ADMIN)
    page.click('#tabs button[data-view="dlq"]')
    page.select_option("#dlq-type", "doomed")
    row = page.locator(f'#dlq tr[data-entry="{first}"]')
    row.wait_for()
    assert "never going to work" in row.inner_text()
    row.locator("button.replay").click()
    with Client(api.url, *ADMIN) as client:
        second = _dead_letter_of(client, task_id, not_entry=first)
    assert second != first
    replayed = [e for e in api.node.events("replayed") if e.get("task_id") == task_id]
    assert len(replayed) == 1

    # It ran again, and failed again (the handler always fails). The node logs its line
    # after the dead letter is written: wait for the line, not just the entry.
    def dead_lines() -> list[dict[str, Any]]:
        return [e for e in api.node.events("dead") if e.get("task_id") == task_id]

    dead = wait_until(lambda: len(dead_lines()) >= 2 and dead_lines(), 30)
    assert len(dead) == 2


def test_the_page_shows_the_error_line_the_api_does(page: Any, api: ApiNode) -> None:
    """The page names a stored error by its exception's line, as the API does, even where
    a message of several lines, a note or a cause puts another line last."""
    sign_in(page, api, READER)
    texts = [text for text, _ in EXAMPLES]
    assert page.evaluate("(texts) => texts.map(errorLine)", texts) == [line for _, line in EXAMPLES]


def _dead_letter_of(client: Client, task_id: str, not_entry: str | None = None) -> str:
    def entry_id() -> str | None:
        for entry in client.dead_letters("doomed", limit=200)["dead_letters"]:
            if entry["task_id"] == task_id and entry["entry_id"] != not_entry:
                return str(entry["entry_id"])
        return None

    return until(entry_id, 30, poll_s=0.1, what=f"a dead letter of {task_id}")


def test_a_read_only_key_gets_no_write_buttons(page: Any, api: ApiNode) -> None:
    with Client(api.url, *ADMIN) as client:
        task_id = f"dash-{time.monotonic_ns()}"
        client.create_task("doomed", {"kind": "once", "at_ms": int(time.time() * 1000)}, None,
                           task_id)  # fmt: skip
        entry = _dead_letter_of(client, task_id)
    sign_in(page, api, READER)
    page.locator("#queues tbody tr").first.wait_for()
    assert page.locator("#who").inner_text() == f"{READER[0]} (read-only)"
    assert page.locator("#queues tbody tr button").first.is_hidden()
    page.click('#tabs button[data-view="dlq"]')
    page.select_option("#dlq-type", "doomed")
    row = page.locator(f'#dlq tr[data-entry="{entry}"]')
    row.wait_for()
    assert row.locator("button.replay").is_hidden()
    assert row.locator("button.purge").is_hidden()
    assert page.locator("#dlq-purge-all").is_hidden()
    row.locator("button", has_text="Show").click()  # reading is allowed
    page.locator("#dlq-detail").wait_for()
    assert "Traceback" in page.locator("#dlq-detail").inner_text()


def test_a_wrong_key_shows_the_apis_problem_details(page: Any, api: ApiNode) -> None:
    sign_in(page, api, (ADMIN[0], "not-the-secret-at-all"))
    error = page.locator("#error")
    error.wait_for()
    assert "401 bad_signature" in error.inner_text()
    assert page.locator("#views").is_hidden()


def test_nodes_and_task_explanations(page: Any, api: ApiNode) -> None:
    task_id = f"dash-{time.monotonic_ns()}"
    with Client(api.url, *ADMIN) as client:
        client.create_task("work", {"kind": "cron", "cron": "0 0 1 1 *"}, None, task_id)
    sign_in(page, api, ADMIN)
    page.click('#tabs button[data-view="nodes"]')
    node = page.locator('.node[data-process="api-node"]')
    node.wait_for()
    text = node.inner_text()
    assert "node/consumers/work/consumer" in text and "running" in text
    # Partition ownership: the node's one poller serves all 16 partitions.
    rows = page.locator("#partitions tbody tr")
    assert rows.count() == 16
    assert "Live pollers:" in page.locator("#pollers").inner_text()
    assert "left" in rows.first.inner_text()  # a live lease
    page.click('#tabs button[data-view="tasks"]')
    page.fill("#task-id", task_id)
    page.click("#task-search button")
    page.locator("#explain li").first.wait_for()
    assert "active: next fire at" in page.locator("#explain").inner_text()
    assert page.locator("#task-note").count() == 0
    # A paused task shows its note, the operator's text as text.
    with Client(api.url, *ADMIN) as client:
        client.pause(task_id, note="<b>vendor</b> outage")
    page.click("#task-search button")
    page.locator("#task-note").wait_for()
    note = page.locator("#task-note").inner_text()
    assert note.startswith(f"Note: paused by key {ADMIN[0]} at ") and note.endswith(
        ": <b>vendor</b> outage"
    )
    # A task that failed: its dead letter and last run show up among its runs.
    doomed = f"dash-{time.monotonic_ns()}"
    with Client(api.url, *ADMIN) as client:
        client.create_task("doomed", {"kind": "once", "at_ms": int(time.time() * 1000)}, None,
                           doomed)  # fmt: skip
        _dead_letter_of(client, doomed)
    page.fill("#task-id", doomed)
    page.click("#task-search button")
    page.wait_for_function(
        "() => document.querySelector('#task-runs') && "
        "document.querySelector('#task-runs').textContent.includes('dead letter')"
    )
    runs = page.locator("#task-runs").inner_text()
    assert "never going to work" in runs and "last run" in runs


def test_the_screenshot_command_runs(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "bench", "screenshots", str(tmp_path)],
                          capture_output=True, text=True, cwd=REPO, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    shots = [Path(p) for p in json.loads(done.stdout)["screenshots"]]
    assert {p.name for p in shots} == {
        "dashboard-queues.png", "dashboard-dlq.png", "dashboard-nodes.png", "dashboard-task.png",
    }  # fmt: skip
    assert all(p.stat().st_size > 5_000 for p in shots)


# -- hardening: the page under its Content-Security-Policy, and no secret kept ------------

WATCH_VIOLATIONS = """
window.__violations = [];
document.addEventListener("securitypolicyviolation",
  (e) => window.__violations.push(`${e.violatedDirective} ${e.blockedURI}`));
"""


def watched(page: Any) -> list[str]:
    """Collect what the browser reports about the page: CSP violations (as events and as
    console errors) and uncaught script errors; returns the list it appends to."""
    problems: list[str] = []
    page.add_init_script(WATCH_VIOLATIONS)

    def console(message: Any) -> None:
        if message.type == "error":
            problems.append(message.text)

    page.on("console", console)
    page.on("pageerror", lambda error: problems.append(f"uncaught: {error}"))
    return problems


def csp_problems(page: Any, problems: list[str]) -> list[str]:
    reported = [p for p in problems if "Content Security Policy" in p or "uncaught" in p]
    return reported + list(page.evaluate("window.__violations"))


def stored_anywhere(page: Any) -> str:
    """Everything the page could keep across a reload: both storages and the cookies."""
    return str(page.evaluate(
        "JSON.stringify({session: {...sessionStorage}, local: {...localStorage},"
        " cookies: document.cookie})"
    ))  # fmt: skip


def some_queue(api: ApiNode) -> None:
    """A fire of ``work``, so that the queue table has a row to show."""
    task_id = f"dash-{time.monotonic_ns()}"
    with Client(api.url, *ADMIN) as client:
        client.create_task("work", {"kind": "cron", "cron": "0 0 1 1 *"}, None, task_id)
        client.trigger(task_id)


def test_the_dashboard_works_under_its_csp_and_keeps_no_secret(page: Any, api: ApiNode) -> None:
    some_queue(api)
    problems = watched(page)
    response = page.goto(api.url + "/dashboard/")
    assert "frame-ancestors 'none'" in response.headers["content-security-policy"]
    page.fill("#key-id", ADMIN[0])
    page.fill("#secret", ADMIN[1])
    page.click("#login button[type=submit]")
    page.locator("#queues tbody tr").first.wait_for()
    # Fires/s needs two scrapes of /metrics, which the page signs: a number, not "-".
    page.wait_for_function(
        "() => [...document.querySelectorAll('#queues tbody tr td:nth-child(8)')]"
        ".some((td) => /^[0-9]/.test(td.textContent))"
    )
    for view in ("dlq", "nodes", "tasks", "queues"):
        page.click(f'#tabs button[data-view="{view}"]')
    page.locator(".node").first.wait_for(state="attached")
    assert page.locator("#error").is_hidden()
    assert csp_problems(page, problems) == []

    kept = stored_anywhere(page)
    assert ADMIN[1] not in kept
    assert page.evaluate("sessionStorage.getItem('metronome-key-id')") == ADMIN[0]
    assert page.input_value("#secret") == ""
    # The signing key in memory cannot give the secret back.
    assert page.evaluate("state.hmacKey.extractable") is False
    exported = page.evaluate(
        "crypto.subtle.exportKey('raw', state.hmacKey).then(() => 'exported', (e) => e.name)"
    )
    assert exported == "InvalidAccessError"

    # The policy is in force: a script injected inline is refused, and reported.
    page.evaluate(
        "() => { const s = document.createElement('script');"
        " s.textContent = 'window.__inlineRan = true'; document.body.append(s); }"
    )
    page.wait_for_function("() => window.__violations.length > 0")
    assert page.evaluate("window.__inlineRan === undefined")


def test_after_a_reload_the_secret_is_asked_again(page: Any, api: ApiNode) -> None:
    some_queue(api)
    sign_in(page, api, READER)
    page.locator("#queues tbody tr").first.wait_for()
    page.reload()
    page.locator("#login").wait_for()
    assert page.locator("#views").is_hidden()
    assert page.input_value("#key-id") == READER[0]  # the key id alone is remembered
    assert page.input_value("#secret") == ""
    assert READER[1] not in stored_anywhere(page)
    page.fill("#secret", READER[1])
    page.click("#login button[type=submit]")
    page.locator("#queues tbody tr").first.wait_for()
    assert page.locator("#who").inner_text() == f"{READER[0]} (read-only)"
