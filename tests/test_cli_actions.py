"""What the CLI says of an action over selected tasks (``--selector``) that does not go
through whole, against a real node and a real Redis: an action outlasting ``--timeout``
goes on in the node and is seen through, never applied twice, by the same command with
the id the CLI names; an action done in part exits as a conflict; so does a bulk add
with conflicts."""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from actors.admin.client import Client
from actors.store.keys import Keys
from tests.api_node import ADMIN, ApiNode, api_node, cli_environment, unique, write_api_config
from tests.cli_runner import run_in_process
from tests.waiting import until

FAR = {"kind": "interval", "every_s": 3600, "start_ms": 4_000_000_000_000}
#: Tasks an action applies a second at most: 30 take the slow node ~6 s.
RATE = 5


@pytest.fixture(scope="module")
def api(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiNode]:
    """A node whose actions are slow (``RATE`` tasks a second, 5 a batch)."""
    namespace = f"cliact{os.getpid()}{unique('n')[-6:]}"
    config = write_api_config(
        tmp_path_factory.mktemp("cli-actions") / "node.toml", redis_url, namespace,
        api_extra="", consumers=f"\n[actions]\nbatch = 5\nrate = {RATE}\n",
    )  # fmt: skip
    with api_node(config, namespace) as node:
        yield node


def cli(api: ApiNode, *args: str) -> subprocess.CompletedProcess[str]:
    return run_in_process(list(args), cli_environment(api))


def make(client: Client, kind: str, n: int) -> list[str]:
    ids = [unique(f"{kind}{i}") for i in range(n)]
    client.create_tasks([{"type": kind, "schedule": FAR, "task_id": t} for t in ids])
    return ids


def test_an_action_outlasting_the_timeout_is_seen_through_by_its_id_never_applied_twice(
    api: ApiNode, db: redis.Redis
) -> None:
    """A trigger of 30 tasks takes the node ~6 s; the CLI's request times out after 2 s.
    The CLI names the action's id and how to see it through; the same command with that
    id answers the action's counts once it is done, and each task fired once (a rerun
    without the id would have been another action: each task fired twice)."""
    kind = unique("slow").replace("-", "")
    with Client(api.url, *ADMIN) as client:
        ids = make(client, kind, 30)
    command = ["tasks", "trigger", "--selector", f"type={kind}", "--yes"]
    cut = cli(api, "--timeout", "2", *command)
    assert cut.returncode == 7, cut.stderr
    found = re.search(r"--action-id (cli-[0-9a-f]+)", cut.stderr)
    assert found is not None and "applied once" in cut.stderr, cut.stderr
    action_id = found.group(1)

    def seen_through() -> dict[str, int] | None:
        again = cli(api, "--json", *command, "--action-id", action_id)
        if again.returncode == 4 and "in_progress" in again.stderr:
            return None  # still applied by the node that took the first request
        assert again.returncode == 0, again.stderr
        done: dict[str, int] = json.loads(again.stdout)
        return done

    done = until(seen_through, 120, poll_s=1, what="the action seen through")
    assert (done["count"], done["changed"], done["failed_count"]) == (30, 30, 0)
    keys = Keys(api.namespace, 16)
    assert db.xlen(keys.queue(kind)) == len(ids)  # each task's trigger appended once


def test_an_action_done_in_part_exits_as_a_conflict(api: ApiNode) -> None:
    """One task of the selection cannot be resumed (it is stopped): the others are, the
    counts say so, and the exit status is a conflict's, as for that one task by its id."""
    kind = unique("part").replace("-", "")
    with Client(api.url, *ADMIN) as client:
        ids = make(client, kind, 3)
        for task_id in ids:
            client.pause(task_id)
        client.stop(ids[0])
    resumed = cli(api, "tasks", "resume", "--selector", f"type={kind}", "--yes")
    assert resumed.returncode == 4, resumed.stderr
    assert "2 changed" in resumed.stdout and "1 failed" in resumed.stdout
    assert "1 failed" in resumed.stderr  # said where errors go too
    alone = cli(api, "tasks", "resume", ids[0])
    assert alone.returncode == 4, alone.stderr


def test_a_bulk_add_with_conflicts_exits_as_a_conflict(api: ApiNode, tmp_path: Path) -> None:
    """A file whose task ids exist with another definition: the others are created, and
    the exit status is a conflict's, as for one task added by its id."""
    kind = unique("bulk").replace("-", "")
    taken = unique("taken")
    with Client(api.url, *ADMIN) as client:
        client.create_task(kind, FAR, {"v": 1}, taken)
    lines = [json.dumps({"type": kind, "schedule": FAR, "task_id": taken, "payload": {"v": 2}}),
             json.dumps({"type": kind, "schedule": FAR, "task_id": unique("new")})]  # fmt: skip
    path = tmp_path / "tasks.jsonl"
    path.write_text("\n".join(lines))
    added = cli(api, "tasks", "add", "--file", str(path))
    assert added.returncode == 4, added.stderr
    assert added.stdout.startswith("1 created, 0 already existed, 1 conflicts")
