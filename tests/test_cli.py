"""The ``metronome`` command end to end against a real node: its ``--json`` output parsed,
its tables read, its exit codes checked. Most calls run ``main`` in this process
(tests/cli_runner.py); the installed console script, exit statuses, a closed pipe and
``serve`` are checked with real processes."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from actors.admin.cli import build_parser
from tests.api_node import (
    ADMIN,
    READER,
    WORK_AND_DOOMED,
    ApiNode,
    api_node,
    cli_environment,
    wait_until,
    write_api_config,
)
from tests.cli_runner import run_in_process
from tests.node_process import REPO

METRONOME = Path(sys.executable).parent / "metronome"


@pytest.fixture(scope="module")
def cli_namespace() -> str:
    return f"cli{time.monotonic_ns() % 10**9}"


@pytest.fixture(scope="module")
def node_config(
    redis_url: str, tmp_path_factory: pytest.TempPathFactory, cli_namespace: str
) -> Path:
    return write_api_config(
        tmp_path_factory.mktemp("cli") / "node.toml",
        redis_url,
        cli_namespace,
        consumers=WORK_AND_DOOMED,
    )


@pytest.fixture(scope="module")
def api(node_config: Path, cli_namespace: str) -> Iterator[ApiNode]:
    with api_node(node_config, cli_namespace) as node:
        yield node


def run(
    api: ApiNode, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``metronome *args`` against ``api``'s node, run in this process (tests/cli_runner.py)."""
    return run_in_process(list(args), cli_environment(api, env))


def run_process(
    api: ApiNode, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """The same as a real ``metronome`` process: for what only a process shows."""
    return subprocess.run(
        [str(METRONOME), *args], capture_output=True, text=True, env=cli_environment(api, env),
        timeout=60,
    )  # fmt: skip


def ok_json(api: ApiNode, *args: str) -> Any:
    done = run(api, "--json", *args)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_console_script_is_installed() -> None:
    assert METRONOME.exists(), "pip install -e . should install the metronome entry point"


def test_task_lifecycle_with_tables_and_json(api: ApiNode) -> None:
    task_id = f"cli-{time.monotonic_ns()}"
    add = ["tasks", "add", "--type", "work", "--every", "3600", "--start",
           "2100-01-01T00:00:00+00:00", "--id", task_id, "--payload", '{"to": "ops"}']  # fmt: skip
    added = run(api, *add)
    assert added.returncode == 0, added.stderr
    assert added.stdout.strip() == f"{task_id} created"
    again = run(api, *add)
    assert "already exists" in again.stdout
    conflict = run(api, "tasks", "add", "--type", "work", "--every", "60", "--id", task_id)
    assert conflict.returncode == 4 and "conflict" in conflict.stderr

    listed = ok_json(api, "tasks", "ls", "--type", "work")
    assert task_id in [t["task_id"] for t in listed["tasks"]]
    table = run(api, "tasks", "ls", "--type", "work").stdout
    assert table.splitlines()[0].split()[:3] == ["TASK_ID", "TYPE", "STATUS"]
    assert task_id in table

    shown = ok_json(api, "tasks", "get", task_id)
    assert shown["payload"] == {"to": "ops"} and shown["schedule"]["every_s"] == 3600.0
    assert "task_id:" in run(api, "tasks", "get", task_id).stdout

    ok_json(api, "tasks", "update", task_id, "--every", "120", "--start", "4102444800000")
    assert ok_json(api, "tasks", "get", task_id)["schedule"]["every_s"] == 120.0
    assert ok_json(api, "tasks", "pause", task_id)["status"] == "paused"
    assert ok_json(api, "tasks", "resume", task_id)["status"] == "active"
    assert ok_json(api, "tasks", "stop", task_id)["status"] == "stopped"
    assert run(api, "tasks", "resume", task_id).returncode == 4
    explained = ok_json(api, "tasks", "explain", task_id)
    assert explained["summary"][0].startswith("stopped")
    assert run(api, "tasks", "explain", task_id).stdout.startswith("- stopped")
    assert ok_json(api, "tasks", "rm", task_id)["deleted"] is True
    missing = run(api, "tasks", "get", task_id)
    assert missing.returncode == 3 and "not found" in missing.stderr


def test_labels_on_add_update_get_and_ls(api: ApiNode) -> None:
    base = f"cli-l{time.monotonic_ns()}"
    add = ["tasks", "add", "--type", "work", "--every", "3600", "--start", "4102444800000"]
    for i in range(6):
        tenant = "acme" if i % 2 else "umbrella"
        done = run(api, *add, "--id", f"{base}-{i}", "--label", f"tenant={tenant}",
                   "--label", f"run={base}")  # fmt: skip
        assert done.returncode == 0, done.stderr
    shown = ok_json(api, "tasks", "get", f"{base}-1")
    assert shown["labels"] == {"tenant": "acme", "run": base}
    assert "tenant=acme" in run(api, "tasks", "get", f"{base}-1").stdout
    listed = ok_json(
        api, "tasks", "ls", "--all", "--label", f"run={base}", "--label", "tenant=acme"
    )
    assert sorted(t["task_id"] for t in listed["tasks"]) == [f"{base}-{i}" for i in (1, 3, 5)]
    paged = ok_json(api, "tasks", "ls", "--label", f"run={base}", "--limit", "1")
    assert len(paged["tasks"]) <= 2
    soon = ok_json(api, "tasks", "ls", "--all", "--label", f"run={base}",
                   "--next-before", "2099-01-01T00:00:00Z")  # fmt: skip
    assert soon["tasks"] == []
    dead = ok_json(api, "tasks", "ls", "--all", "--label", f"run={base}", "--last-status", "dead")
    assert dead["tasks"] == []

    ok_json(api, "tasks", "update", f"{base}-1", "--label", "tenant=initech")
    assert ok_json(api, "tasks", "get", f"{base}-1")["labels"] == {"tenant": "initech"}
    ok_json(api, "tasks", "update", f"{base}-1", "--no-labels")
    assert ok_json(api, "tasks", "get", f"{base}-1")["labels"] == {}
    bad = run(api, *add, "--label", "tenant")
    assert bad.returncode == 5 and "--label" in bad.stderr
    refused = run(api, *add, "--label", "a=b:c")
    assert refused.returncode == 5 and "--label" in refused.stderr


def test_pause_and_resume_with_a_note_that_get_shows(api: ApiNode) -> None:
    task_id = f"cli-{time.monotonic_ns()}"
    run(api, "tasks", "add", "--type", "work", "--cron", "0 0 1 1 *", "--id", task_id)
    paused = run(api, "tasks", "pause", task_id, "--note", "vendor outage")
    assert paused.returncode == 0 and paused.stdout.strip() == f"{task_id} paused (paused)"
    note = ok_json(api, "tasks", "get", task_id)["note"]
    assert (note["note"], note["action"], note["by"]) == ("vendor outage", "pause", ADMIN[0])
    shown = run(api, "tasks", "get", task_id).stdout
    assert f"by key {ADMIN[0]}: vendor outage" in shown.splitlines()[-1]
    assert shown.splitlines()[-1].startswith("note:")
    too_long = run(api, "tasks", "resume", task_id, "--note", "x" * 501)
    assert too_long.returncode != 0 and "note" in too_long.stderr
    assert ok_json(api, "tasks", "resume", task_id, "--note", "back")["status"] == "active"
    assert ok_json(api, "tasks", "get", task_id)["note"]["note"] == "back"
    assert ok_json(api, "tasks", "pause", task_id)["status"] == "paused"
    assert "note:" not in run(api, "tasks", "get", task_id).stdout


def test_trigger_and_queues(api: ApiNode, tmp_path: Path) -> None:
    task_id = f"cli-{time.monotonic_ns()}"
    run(api, "tasks", "add", "--type", "work", "--cron", "0 0 1 1 *", "--id", task_id)
    triggered = ok_json(api, "tasks", "trigger", task_id)
    assert triggered["schedule_id"].startswith(task_id)
    wait_until(lambda: ok_json(api, "tasks", "get", task_id)["runs"] == 1)
    queues = ok_json(api, "queues")
    assert "work" in [q["type"] for q in queues["queues"]]
    assert run(api, "queues").stdout.splitlines()[0].startswith("TYPE")
    assert ok_json(api, "queues", "work")["type"] == "work"


def test_partitions_show_the_poller_serving_each(api: ApiNode) -> None:
    """The node's one poller owns every partition; the view says so, and what is due."""

    def all_served() -> bool:
        view = ok_json(api, "partitions")
        return bool(view["pollers"]) and all(
            p["live"] and p["poller"] == view["pollers"][0] for p in view["partitions"]
        )

    wait_until(all_served)
    view = ok_json(api, "partitions")
    assert len(view["pollers"]) == 1 and len(view["partitions"]) == 16
    assert [p["partition"] for p in view["partitions"]] == list(range(16))
    assert all(p["lease_until_ms"] > view["now_ms"] for p in view["partitions"])
    lines = run(api, "partitions").stdout.splitlines()
    assert lines[0] == f"live pollers: {view['pollers'][0]}"
    assert lines[1].split() == ["PARTITION", "POLLER", "LEASE", "IN_FLIGHT", "DUE_NOW", "NEXT_DUE"]
    assert len(lines) == 2 + 16


def test_bulk_add_from_a_json_lines_file(api: ApiNode, tmp_path: Path) -> None:
    tag = f"bulk{time.monotonic_ns()}"
    lines = [
        json.dumps({"type": "work", "task_id": f"{tag}-{i}",
                    "schedule": {"kind": "interval", "every_s": 3600, "start_ms": 4102444800000}})
        for i in range(120)
    ]  # fmt: skip
    path = tmp_path / "tasks.jsonl"
    path.write_text("\n".join(lines))
    created = ok_json(api, "tasks", "add", "--file", str(path), "--batch", "50")
    assert (created["created"], created["conflicts"]) == (120, 0)
    assert run(api, "tasks", "add", "--file", str(path)).stdout.startswith("0 created, 120")
    # A bad item in a later request is named by its place in the file, with what the
    # requests before it did; a batch size below 1 is refused before anything is sent.
    bad = json.loads(lines[70]) | {"task_id": f"{tag}-bad", "schedule": {"kind": "weekly"}}
    path.write_text("\n".join([*lines[:70], json.dumps(bad), *lines[71:]]))
    refused = run(api, "tasks", "add", "--file", str(path), "--batch", "50")
    assert refused.returncode != 0
    assert "tasks[70]" in refused.stderr and "tasks[20]" not in refused.stderr
    assert "tasks 0..49 of the file were sent before: 0 created, 50 already" in refused.stderr
    for batch in ("0", "-1"):
        nothing = run(api, "tasks", "add", "--file", str(path), "--batch", batch)
        assert nothing.returncode == 2 and "--batch: must be at least 1" in nothing.stderr


def test_dead_letters_ls_show_replay_purge(api: ApiNode) -> None:
    task_id = f"cli-{time.monotonic_ns()}"
    at = str(int(time.time() * 1000))
    run(api, "tasks", "add", "--type", "doomed", "--at", at, "--id", task_id)

    def entries() -> list[dict[str, Any]]:
        page = ok_json(api, "dlq", "ls", "doomed")
        return [d for d in page["dead_letters"] if d["task_id"] == task_id]

    (entry,) = wait_until(entries)
    shown = ok_json(api, "dlq", "show", "doomed", entry["entry_id"])
    assert shown["reason"] == "unrecoverable"
    assert ok_json(api, "dlq", "replay", "doomed", entry["entry_id"])["replayed"] == 1
    wait_until(lambda: len(entries()) == 1 and entries()[0]["entry_id"] != entry["entry_id"])
    refused = run(api, "dlq", "purge", "doomed", "--all")
    assert refused.returncode == 2 and "--yes" in refused.stderr
    assert ok_json(api, "dlq", "purge", "doomed", "--all", "--yes")["purged"] >= 1
    assert entries() == []


def test_exit_codes_for_bad_input_bad_credentials_and_no_server(api: ApiNode) -> None:
    invalid = run_process(api, "tasks", "add", "--type", "bad type", "--every", "1")
    assert invalid.returncode == 5 and "type" in invalid.stderr
    no_schedule = run_process(api, "tasks", "add", "--type", "work")
    assert no_schedule.returncode == 2
    wrong = run_process(api, "tasks", "ls", env={"METRONOME_SECRET": "not-the-secret-at-all"})
    assert wrong.returncode == 6 and "bad_signature" in wrong.stderr
    reader = run_process(api, "tasks", "add", "--type", "work", "--every", "5",
                 env={"METRONOME_KEY_ID": READER[0], "METRONOME_SECRET": READER[1]})  # fmt: skip
    assert reader.returncode == 6 and "read_only" in reader.stderr
    unset = run_process(api, "tasks", "ls", env={"METRONOME_SECRET": ""})
    assert unset.returncode == 2
    gone = run_process(api, "--url", "http://127.0.0.1:9", "tasks", "ls")
    assert gone.returncode == 7 and "cannot reach" in gone.stderr


def test_serve_is_python_m_runtime(api: ApiNode, node_config: Path) -> None:
    # --check resolves every key, so the reader key's secret must be in the environment.
    reader_secret = {"TEST_READER_SECRET": READER[1]}
    for args in ([str(node_config), "--check"], ["--check", str(node_config)]):
        checked = run_process(api, "serve", *args, env=reader_secret)
        assert checked.returncode == 0, checked.stderr
        assert checked.stdout.strip().endswith(": ok")


def one_line_refusal(done: subprocess.CompletedProcess[str], status: int, *words: str) -> None:
    """A refusal as the CLI promises it: the documented exit status and one line on stderr
    that says what is wrong, never a traceback."""
    assert done.returncode == status, (done.returncode, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("metronome: "), done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    for word in words:
        assert word in lines[0], (word, lines[0])


def test_bad_input_is_one_line_and_a_documented_exit_status(api: ApiNode, tmp_path: Path) -> None:
    tag = f"bad{time.monotonic_ns()}"
    jsonl = tmp_path / "tasks.jsonl"
    jsonl.write_text('{"type": "work", "schedule": {"kind": "once", "at_ms": 1}}\n{"type" "x"}\n')
    duplicate = tmp_path / "dup.json"
    twice = {"type": "work", "task_id": f"{tag}-dup", "schedule": {"kind": "once", "at_ms": 1}}
    duplicate.write_text(json.dumps([twice, twice]))
    internal = tmp_path / "internal.json"
    internal.write_text(json.dumps([{"type": "work", "_payload_json": "x", "schedule": {}}]))
    words = tmp_path / "words.json"
    words.write_text(json.dumps([{"type": "work", "schedule": "every 5"}]))
    cases: list[tuple[Any, ...]] = [
        (["tasks", "add", "--file", str(tmp_path / "missing.json")], 2, "--file", "No such file"),
        (["tasks", "add", "--type", "work", "--every", "60", "--payload", "@/no/such"], 2,
         "--payload"),
        (["tasks", "add", "--file", str(jsonl)], 2, "line 2 column"),
        (["tasks", "add", "--type", "work", "--every", "60", "--payload", '{"a": 1, "a": 2}'], 2,
         "--payload", "'a' is given twice"),
        (["tasks", "add", "--file", str(duplicate)], 5, "tasks[1].task_id"),
        (["tasks", "add", "--file", str(internal)], 5, "'_payload_json'", "did you mean 'payload'"),
        (["tasks", "add", "--file", str(words)], 5, "tasks[0].schedule: must be an object"),
        (["tasks", "add", "--type", "work", "--cron", "0 0 * * * *"], 5, "five fields"),
        (["tasks", "add", "--type", "work", "--every", "0.001"], 5, "min_interval_s"),
        (["tasks", "add", "--type", "work", "--every", "1e308"], 5, "schedule.every_s"),
        (["tasks", "get", "a/b"], 5, "task id 'a/b'"),
        (["dlq", "show", "doomed", "a/b"], 5, "entry id 'a/b'"),
        (["dlq", "replay", "doomed", "1-0"], 3),
        # flags the command would ignore, or one takes back what the other says
        (["tasks", "add", "--file", str(duplicate), "--type", "other", "--every", "5",
          "--label", "env=prod"], 2, "--file takes no --type, --label, --every"),
        (["tasks", "update", f"{tag}-x", "--no-labels", "--label", "x=y"], 2, "not both"),
        (["tasks", "ls", "--all", "--cursor", "0-0-0"], 2, "--all or --cursor"),
        (["schedule", "preview", "--every", "60", "--from", "0001-01-01T00:00:00+14:00"], 2,
         "--from", "outside 1970-01-01..9999-12-31"),
        (["schedule", "preview", "--every", "60", "--from", "999999999999999"], 2,
         "--from", "past year 9999"),
        (["queues", "purge", "work"], 2, "--yes"),
    ]  # fmt: skip
    for args, status, *expected in cases:
        one_line_refusal(run(api, *args), status, *expected)
    created = ok_json(api, "tasks", "ls", "--type", "work", "--limit", "1000")["tasks"]
    assert not [t for t in created if t["task_id"].startswith(tag)]


def test_a_selector_flag_given_with_a_task_id_changes_nothing(api: ApiNode) -> None:
    """``--dry-run`` (``--all``, ``--action-id``) goes with ``--selector``: given with a
    task id instead, it is refused, and the task is not deleted or stopped as if it had
    not been given."""
    task_id = f"cli-{time.monotonic_ns()}"
    run(api, "tasks", "add", "--type", "work", "--cron", "0 0 1 1 *", "--id", task_id)
    refused = (["rm", task_id, "--dry-run"], ["stop", task_id, "--dry-run"],
               ["pause", task_id, "--action-id", "a1"], ["trigger", task_id, "--all"])  # fmt: skip
    for args in refused:
        one_line_refusal(run(api, "tasks", *args), 2, "only with --selector")
    assert ok_json(api, "tasks", "get", task_id)["status"] == "active"
    assert ok_json(api, "tasks", "backfill", task_id, "--from", "2026-01-01T00:00:00Z",
                   "--to", "2026-01-02T00:00:00Z", "--dry-run")["dry_run"] is True  # fmt: skip


def test_a_number_flag_given_nan_or_infinity_is_a_usage_error(api: ApiNode) -> None:
    """NaN and infinity are no number of seconds: refused by the flag, not sent on as
    JSON the API refuses, nor a traceback."""
    for args in (
        ["tasks", "add", "--type", "work", "--every", "nan"],
        ["tasks", "add", "--type", "work", "--every", "60", "--jitter", "inf"],
        ["tasks", "add", "--type", "work", "--every", "1e400"],
        ["--timeout", "nan", "tasks", "ls"],
    ):
        done = run(api, *args)
        assert done.returncode == 2, (args, done.returncode, done.stderr)
        assert "must be a finite number" in done.stderr and "Traceback" not in done.stderr


def test_a_timeout_of_no_time_or_a_time_past_year_9999_is_a_usage_error(api: ApiNode) -> None:
    for args, said in (
        (["--timeout", "-1", "tasks", "ls"], "must be more than 0 seconds"),
        (["--timeout", "0", "tasks", "ls"], "must be more than 0 seconds"),
        (["tasks", "add", "--type", "work", "--at", "9" * 5000], "past year 9999"),
    ):
        done = run(api, *args)
        assert done.returncode == 2, (args, done.returncode, done.stderr)
        assert said in done.stderr and "unexpected error" not in done.stderr, done.stderr


def test_output_cut_short_by_a_closed_pipe_ends_quietly(api: ApiNode, tmp_path: Path) -> None:
    lines = [json.dumps({"type": "work", "schedule": {"kind": "cron", "cron": "0 0 1 1 *"}})
             for _ in range(3000)]  # fmt: skip
    (tmp_path / "many.jsonl").write_text("\n".join(lines))
    assert run(api, "tasks", "add", "--file", str(tmp_path / "many.jsonl")).returncode == 0
    done = subprocess.run(
        f"'{METRONOME}' tasks ls --all | head -1",
        shell=True, capture_output=True, text=True, env=cli_environment(api), timeout=60,
    )  # fmt: skip
    assert done.stdout.startswith("TASK_ID")
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, done.stderr


def test_update_with_only_a_modifier_changes_the_current_schedule(api: ApiNode) -> None:
    task_id = f"cli-{time.monotonic_ns()}"
    run(api, "tasks", "add", "--type", "work", "--cron", "0 0 1 1 *", "--tz", "Europe/Paris",
        "--id", task_id)  # fmt: skip
    ok_json(api, "tasks", "update", task_id, "--jitter", "2")
    schedule = ok_json(api, "tasks", "get", task_id)["schedule"]
    assert schedule == {"kind": "cron", "cron": "0 0 1 1 *", "tz": "Europe/Paris", "jitter_s": 2.0}


def test_trigger_of_a_stopped_task_is_refused(api: ApiNode) -> None:
    task_id = f"cli-{time.monotonic_ns()}"
    run(api, "tasks", "add", "--type", "work", "--cron", "0 0 1 1 *", "--id", task_id)
    ok_json(api, "tasks", "stop", task_id)
    one_line_refusal(run(api, "tasks", "trigger", task_id), 4, "stopped")
    assert ok_json(api, "tasks", "get", task_id)["runs"] == 0


def test_queue_purge_deletes_undelivered_messages_of_a_type_nobody_consumes(
    api: ApiNode,
) -> None:
    task_type = f"orphan{time.monotonic_ns() % 10**6}"
    for i in range(3):
        run(api, "tasks", "add", "--type", task_type, "--cron", "0 0 1 1 *", "--id",
            f"{task_type}-{i}")  # fmt: skip
        ok_json(api, "tasks", "trigger", f"{task_type}-{i}")
    assert ok_json(api, "queues", task_type)["undelivered"] == 3
    explained = ok_json(api, "tasks", "explain", f"{task_type}-0")["summary"]
    assert any(f"no consumer of type {task_type} is running" in line for line in explained)
    purged = ok_json(api, "queues", "purge", task_type, "--yes")
    assert purged == {"type": task_type, "purged": 3}
    queue = ok_json(api, "queues", task_type)
    assert (queue["length"], queue["undelivered"]) == (0, 0)
    events = api.node.events("queue_purged")
    assert {"type": task_type, "count": 3}.items() <= events[-1].items()


def test_dead_letters_show_the_error_line_and_the_traceback_on_request(api: ApiNode) -> None:
    task_id = f"cli-{time.monotonic_ns()}"
    run(api, "tasks", "add", "--type", "doomed", "--at", str(int(time.time() * 1000)), "--id",
        task_id)  # fmt: skip

    def entry() -> dict[str, Any] | None:
        page = ok_json(api, "dlq", "ls", "doomed")
        return next((d for d in page["dead_letters"] if d["task_id"] == task_id), None)

    dead = wait_until(entry)
    assert dead["error"].startswith("Traceback")
    assert dead["error_line"].endswith("Unrecoverable: never going to work")
    row = next(line for line in run(api, "dlq", "ls", "doomed").stdout.splitlines()
               if task_id in line)  # fmt: skip
    assert row.endswith("Unrecoverable: never going to work")
    shown = run(api, "dlq", "show", "doomed", dead["entry_id"]).stdout
    assert "Traceback" not in shown and "never going to work" in shown
    full = run(api, "dlq", "show", "doomed", dead["entry_id"], "--traceback").stdout
    assert "Traceback (most recent call last)" in full
    explained = "\n".join(ok_json(api, "tasks", "explain", task_id)["summary"])
    assert "Traceback" not in explained and "never going to work" in explained


def test_help_is_plain_text_and_every_option_says_what_it_does() -> None:
    parser = build_parser()
    text = parser.format_help()
    assert "``" not in text
    undocumented = []
    actions = list(parser._actions)
    while actions:
        action = actions.pop()
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                actions += sub._actions
        elif not isinstance(action, argparse._HelpAction) and not action.help:
            undocumented.append("/".join(action.option_strings) or action.dest)
    assert not undocumented


def test_serve_imports_handler_modules_from_the_current_directory(
    redis_url: str, tmp_path: Path
) -> None:
    (tmp_path / "local_handlers.py").write_text("async def run(ctx):\n    return None\n")
    config = tmp_path / "node.toml"
    config.write_text(f'[redis]\nurl = "{redis_url}"\n[consumers.local]\n'
                      'handler = "local_handlers:run"\n')  # fmt: skip
    without_path = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([str(METRONOME), "serve", "node.toml", "--check"], cwd=tmp_path,
                          capture_output=True, text=True, env=without_path, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr


def test_the_signing_example_in_the_api_docs_works_as_written(api: ApiNode) -> None:
    text = (REPO / "docs" / "API.md").read_text()
    example = text.split("```python\n", 1)[1].split("```", 1)[0]
    example = (
        example.replace('"local", b"local-demo-secret-change-me"', f'"{ADMIN[0]}", b"{ADMIN[1]}"')
        .replace('"http://127.0.0.1:8080"', f'"{api.url}"')
        .replace('"demo"', '"work"')
    )
    done = subprocess.run([sys.executable, "-c", example], capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("201 {'task_id'"), done.stdout


def test_backfill_a_task_and_a_type_with_tables_and_json(api: ApiNode) -> None:
    task_id = f"cli-backfill-{time.monotonic_ns()}"
    kind = f"cliback{time.monotonic_ns() % 10**6}"  # a type of its own: by-type sees it alone
    ok_json(api, "tasks", "add", "--type", kind, "--cron", "0 * * * *", "--id", task_id,
            "--overlap", "buffer_all")  # fmt: skip
    hour = dt.datetime.now(dt.UTC).replace(minute=0, second=0, microsecond=0)
    start, end = (hour - dt.timedelta(hours=3)).isoformat(), hour.isoformat()
    window = ["--from", start, "--to", end]
    expected = [int((hour - dt.timedelta(hours=h)).timestamp() * 1000) for h in (3, 2, 1)]

    dry = run(api, "tasks", "backfill", task_id, *window, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    lines = dry.stdout.splitlines()
    assert lines[0].split() == ["DUE", "(UTC)", "DUE_MS", "SCHEDULE_ID"]
    assert [line.split()[-1] for line in lines[1:4]] == [f"{task_id}:{d}" for d in expected]
    assert "dry run, nothing enqueued" in lines[-1] and "3 would be enqueued" in lines[-1]

    done = ok_json(api, "tasks", "backfill", task_id, "--from", str(expected[0]), "--to", end)
    assert [f["due_ms"] for f in done["fires"]] == expected
    # The first starts; the others wait for it (held back, and taken by this backfill).
    assert (done["enqueued"], done["held_back"], done["overlap"]) == (1, 2, "buffer_all")
    again = run(api, "tasks", "backfill", task_id, *window)
    assert again.returncode == 0 and "0 enqueued, 3 already backfilled" in again.stdout

    by_type = ok_json(api, "backfill", "--type", kind, *window, "--dry-run")
    assert by_type["tasks"] == [
        {"task_id": task_id, "fires": 3, "enqueued": 0, "already_backfilled": 3, "held_back": 0,
         "skipped": 0}
    ]  # fmt: skip
    table = run(api, "backfill", "--type", kind, *window).stdout.splitlines()
    assert table[0].split() == ["TASK_ID", "FIRES", "ENQUEUED", "ALREADY"]
    assert table[1].split() == [task_id, "3", "0", "3"]

    future = (hour + dt.timedelta(hours=2)).isoformat()
    refused = run(api, "tasks", "backfill", task_id, "--from", start, "--to", future)
    assert refused.returncode == 5 and "end_ms: must not be in the future" in refused.stderr
    bad = run(api, "tasks", "backfill", task_id, "--from", "last week", "--to", end)
    assert bad.returncode == 2 and "--from" in bad.stderr


def test_history_attention_and_acknowledge(api: ApiNode) -> None:
    task_id = f"ledger-{time.monotonic_ns()}"
    at_ms = int(time.time() * 1000)
    ok_json(api, "tasks", "add", "--type", "doomed", "--id", task_id, "--at", str(at_ms))

    def dead() -> Any:
        history = ok_json(api, "tasks", "history", task_id)["history"]
        return history if history and history[0]["fate"] == "dead" else None

    (entry,) = wait_until(dead, timeout_s=60)
    assert (entry["origin"], entry["attempt"], entry["due_ms"]) == ("schedule", 0, at_ms)
    assert entry["error"].endswith("Unrecoverable: never going to work")
    shown = run(api, "tasks", "history", task_id)
    assert (
        shown.returncode == 0 and "dead" in shown.stdout and "never going to work" in shown.stdout
    )
    listed = ok_json(api, "attention", "--type", "doomed", "--reason", "dead")["items"]
    assert task_id in {e["task_id"] for e in listed}
    assert task_id in run(api, "attention").stdout
    # --limit is the listing's length, read a page (at most 1,000) at a time.
    assert task_id in {e["task_id"] for e in ok_json(api, "attention", "--limit", "2500")["items"]}
    assert ok_json(api, "tasks", "ls", "--type", "doomed", "--last-fate", "dead")["tasks"]
    acked = ok_json(api, "tasks", "acknowledge", task_id, "--note", "expected in the test")
    assert acked["acknowledged"] is True and acked["entry"]["reason"] == "dead"
    listed = ok_json(api, "attention", "--type", "doomed")["items"]
    assert task_id not in {e["task_id"] for e in listed}
    explained = ok_json(api, "tasks", "explain", task_id)
    assert explained["history"][0]["fate"] == "dead"
    assert explained["acknowledged"]["note"] == "expected in the test"
    assert explained["attention"] is None


def test_control_characters_from_a_handler_reach_no_terminal_raw(api: ApiNode) -> None:
    """A handler's error quoting its input (escape sequences that clear the screen, set
    the window title, colour the text) is printed written out, never raw: only newline
    and tab pass, in every view that shows the error."""
    task_id = f"cli-{time.monotonic_ns()}"
    said = "bad input: \x1b]0;pwned\x07\x1b[2J\x1b[31mRED\r\x9b1m"
    ok_json(api, "tasks", "add", "--type", "doomed", "--id", task_id, "--payload",
            json.dumps({"say": said}), "--at", str(int(time.time() * 1000)))  # fmt: skip

    def dead() -> Any:
        page = ok_json(api, "dlq", "ls", "doomed")
        return next((d for d in page["dead_letters"] if d["task_id"] == task_id), None)

    entry = wait_until(dead, timeout_s=60)
    assert entry["error_line"].endswith(said)  # the JSON keeps the text as it was
    views = [
        ["tasks", "get", task_id], ["tasks", "explain", task_id], ["tasks", "history", task_id],
        ["attention", "--type", "doomed"], ["dlq", "ls", "doomed"],
        ["dlq", "show", "doomed", entry["entry_id"]],
    ]  # fmt: skip
    for view in views:
        shown = run(api, *view)
        assert shown.returncode == 0, (view, shown.stderr)
        raw = {c for c in shown.stdout if ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F} - {"\n", "\t"}
        assert not raw, (view, raw)
        assert "\\x1b]0;pwned\\x07" in shown.stdout, (view, shown.stdout)
