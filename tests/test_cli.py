"""The ``metronome`` console script end to end: a real process against a real node, its
``--json`` output parsed, its exit codes checked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.api_node import (
    ADMIN,
    READER,
    WORK_AND_DOOMED,
    ApiNode,
    api_node,
    wait_until,
    write_api_config,
)
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
    environment = {
        **os.environ,
        "METRONOME_URL": api.url,
        "METRONOME_KEY_ID": ADMIN[0],
        "METRONOME_SECRET": ADMIN[1],
        "PYTHONPATH": str(REPO),  # the test handlers the node config names
        **(env or {}),
    }
    return subprocess.run(
        [str(METRONOME), *args], capture_output=True, text=True, env=environment, timeout=60
    )


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
    invalid = run(api, "tasks", "add", "--type", "bad type", "--every", "1")
    assert invalid.returncode == 5 and "type" in invalid.stderr
    no_schedule = run(api, "tasks", "add", "--type", "work")
    assert no_schedule.returncode == 2
    wrong = run(api, "tasks", "ls", env={"METRONOME_SECRET": "not-the-secret-at-all"})
    assert wrong.returncode == 6 and "bad_signature" in wrong.stderr
    reader = run(api, "tasks", "add", "--type", "work", "--every", "5",
                 env={"METRONOME_KEY_ID": READER[0], "METRONOME_SECRET": READER[1]})  # fmt: skip
    assert reader.returncode == 6 and "read_only" in reader.stderr
    unset = run(api, "tasks", "ls", env={"METRONOME_SECRET": ""})
    assert unset.returncode == 2
    gone = run(api, "--url", "http://127.0.0.1:9", "tasks", "ls")
    assert gone.returncode == 7 and "cannot reach" in gone.stderr


def test_serve_is_python_m_runtime(api: ApiNode, node_config: Path) -> None:
    # --check resolves every key, so the reader key's secret must be in the environment.
    checked = run(api, "serve", str(node_config), "--check", env={"TEST_READER_SECRET": READER[1]})
    assert checked.returncode == 0, checked.stderr
    assert checked.stdout.strip().endswith(": ok")
